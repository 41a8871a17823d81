"""tts through the whole stack: a scripted job's call goes to a real `media` worker, which
speaks with espeak-ng and encodes with ffmpeg; the audio artifact is then served by the
HTTP API to its owner (and to nobody else) and decodes to the length the result states."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import Cluster, call, script, serve_api, start_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(groups=("media",))


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[str]:
    yield from serve_api(cluster)


def test_a_job_speaks_and_the_audio_is_served_by_the_api(
    cluster: Cluster, api: str, workspace: Path
) -> None:
    from broker.stores.api_keys import ApiKeyStore

    keys = ApiKeyStore(cluster.client.store)
    alice, bob = keys.create("alice")[1], keys.create("bob")[1]
    text = "The build finished. All tests passed, and the release is ready to ship."
    job = cluster.client.submit(
        "say it",
        workspace=str(workspace),
        user="alice",
        script=script({"tool_calls": [call("t", "tts", text=text)]}, {"text": "said"}),
    )
    result = job.wait(timeout=90)
    assert result.status == "completed", result
    (spoken,) = result.tool_calls
    assert not spoken.is_error and spoken.queue == "media", spoken.output
    assert "spoken by espeak in 1 request" in spoken.output
    found = re.search(
        r"artifact (art_[0-9a-f]+) \(audio/ogg, \d+ bytes, ([\d.]+) s\)", spoken.output
    )
    assert found, spoken.output

    url = f"{api}/v1/artifacts/{found.group(1)}"
    fetched = httpx.get(url, headers={"Authorization": f"Bearer {alice}"})
    assert fetched.status_code == 200 and fetched.headers["content-type"] == "audio/ogg"
    assert fetched.content[:4] == b"OggS"
    decode = ["ffmpeg", "-nostdin", "-loglevel", "error", "-i", "-", "-f", "s16le", "-ac", "1"]
    pcm = subprocess.run(
        [*decode, "-ar", "16000", "-"],
        input=fetched.content,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    seconds = len(pcm) / 2 / 16000
    assert seconds == pytest.approx(float(found.group(2)), abs=0.1)
    assert 2.5 < seconds < 8  # 13 words: 4.5 s at espeak-ng's nominal 175 words a minute
    other = httpx.get(url, headers={"Authorization": f"Bearer {bob}"})
    assert other.status_code == 404
