"""skill_search over a corpus of 20 skills (tests/fixtures/skills), called as a worker
calls it; the index's refresh across "processes" (index objects sharing one Redis db);
malformed skills; and read_file inside the skill roots (read-only)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import redis

from broker import keys
from broker.config.settings import Settings
from broker.protocol import CallContext
from tests.conftest import Isolated
from workers.execute import run_tool
from workers.registry import default_registry
from workers.tool import ToolContext, ToolResult
from workers.tools.media import skill_index
from workers.tools.media.skill_index import SkillIndex, tokenize

REGISTRY = default_registry()
CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "skills"

# Written before the ranker was run, the way a user would ask; never tuned to it.
QUERIES = [
    (
        "I have a government application as a PDF with empty boxes, can you put my details "
        "into it?",
        "pdf-form-filler",
    ),
    ("make a bar graph of monthly sales inside my spreadsheet", "excel-chart-builder"),
    (
        "the build started failing sometime in the last 200 commits and I don't know which "
        "change broke it",
        "git-bisect",
    ),
    (
        "run my web app, postgres and redis together locally with one command",
        "docker-compose-stack",
    ),
    ("add a new column to the users table in production without downtime", "sql-migrations"),
    ("write a polite message to my landlord asking to fix the heating", "email-drafting"),
    ("shrink all these photos to 800 pixels wide for the website thumbnails", "image-resizing"),
    ("pull product prices from an online shop's pages every day", "web-scraping"),
    ("cover the edge cases of my parsing function with automated tests", "python-unit-testing"),
    ("roll out the new version of our service to the cluster with zero downtime", "k8s-deploy"),
    (
        "this exported file has duplicate rows, weird dates and broken accents, tidy it up",
        "csv-cleaning",
    ),
    ("put this user manual into Spanish and German", "translation"),
    (
        "summarize yesterday's standup recording transcript into decisions and who does what",
        "meeting-notes",
    ),
    ("I need a pattern that matches phone numbers in several formats", "regex-builder"),
    (
        "why did our server return so many 500 errors last night? here are the nginx files",
        "log-analysis",
    ),
    ("generate a typed Python SDK from our openapi.yaml", "api-client-generator"),
    (
        "format my thesis with citations and a bibliography for the journal submission",
        "latex-paper",
    ),
    ("turn this podcast episode mp3 into text with timestamps", "audio-transcription"),
    (
        "find a time next week when Tokyo, Berlin and New York colleagues are all free",
        "calendar-scheduling",
    ),
    (
        "check this login code for vulnerabilities like SQL injection before we ship",
        "security-review",
    ),
]


def context(settings: Settings, client: redis.Redis | None, workspace: str = "/tmp") -> ToolContext:
    return ToolContext(CallContext(workspace=workspace), settings, redis=client)


def search(settings: Settings, client: redis.Redis | None = None, **args: Any) -> ToolResult:
    return run_tool(REGISTRY, "skill_search", args, context(settings, client))


@pytest.fixture
def client(isolated: Isolated) -> Any:
    with redis.Redis.from_url(isolated.redis_url) as c:
        yield c


@pytest.fixture
def skills(tmp_path: Path) -> Path:
    """A private copy of the corpus, to edit."""
    root = tmp_path / "skills"
    shutil.copytree(CORPUS, root)
    return root


def write_skill(root: Path, folder: str, name: str, description: str, body: str = "") -> Path:
    path = root / folder / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\nname: {name}\ndescription: {description}\n---\n\n{body}\n")
    return path


def test_corpus_has_twenty_distinct_skills(caplog: pytest.LogCaptureFixture) -> None:
    """As skill_search loads them: twenty skills, none skipped (no malformed front matter,
    no name taken twice), each named as its folder, with a description and instructions,
    and each query's answer is one of them."""
    folders = sorted(p.parent.name for p in CORPUS.glob("*/SKILL.md"))
    with caplog.at_level(logging.WARNING):
        loaded, _ = skill_index.load_skills(skill_index.find_skill_files([str(CORPUS)]))
    assert caplog.records == []
    assert len(folders) == 20 and sorted(s.name for s in loaded) == folders
    for skill in loaded:
        assert Path(skill.path).parent.name == skill.name
        assert len(skill.description) >= 40 and len(skill.body) >= 200, skill.name
    assert len({s.description for s in loaded}) == 20
    assert sorted(q[1] for q in QUERIES) == folders


def test_right_skill_first_for_at_least_18_of_20(isolated: Isolated, client: Any) -> None:
    settings = isolated.settings.model_copy(update={"skill_roots": [str(CORPUS)]})
    misses = []
    for query, expected in QUERIES:
        result = search(settings, client, query=query)
        assert not result.is_error, result.for_llm
        ranked = [r["name"] for r in result.metadata["results"]]
        if not ranked or ranked[0] != expected:
            misses.append(f"{query!r}: expected {expected}, got {ranked[:3]}")
    print(f"\nskill_search hit rate: {20 - len(misses)}/20")
    for miss in misses:
        print("  miss:", miss)
    assert len(misses) <= 2, "\n".join(misses)


def test_result_shape_limit_and_closing_line(isolated: Isolated, client: Any) -> None:
    settings = isolated.settings.model_copy(
        update={"skill_roots": [str(CORPUS)], "skill_search_max_results": 3}
    )
    result = search(settings, client, query="deploy containers with docker or kubernetes")
    assert not result.is_error
    results = result.metadata["results"]
    assert 1 <= len(results) <= 3
    assert {r["name"] for r in results[:2]} == {"docker-compose-stack", "k8s-deploy"}
    scores = [r["score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    for r in results:
        assert set(r) == {"name", "description", "path", "score"}
        assert r["path"].endswith(f"/{r['name']}/SKILL.md") and os.path.isabs(r["path"])
        assert r["score"] == round(r["score"], 2) and r["path"] in result.for_llm
    assert result.for_llm.splitlines()[-1].startswith("To use a skill, read its SKILL.md")
    assert "read_file" in result.for_llm.splitlines()[-1]
    # a limit within the maximum is honoured; above it, the maximum wins
    assert len(search(settings, client, query="data", limit=1).metadata["results"]) == 1
    assert len(search(settings, client, query="data files", limit=50).metadata["results"]) <= 3
    bad = search(settings, client, query="x", limit=0)
    assert bad.is_error
    assert search(settings, client, query="x", unknown=1).is_error


def test_no_roots_no_skills_no_match(isolated: Isolated, client: Any, tmp_path: Path) -> None:
    none = search(isolated.settings.model_copy(update={"skill_roots": []}), client, query="pdf")
    assert not none.is_error and "No skills are configured" in none.for_llm
    empty = tmp_path / "empty"
    empty.mkdir()
    settings = isolated.settings.model_copy(update={"skill_roots": [str(empty)]})
    nothing = search(settings, client, query="pdf")
    assert not nothing.is_error and "No skills found" in nothing.for_llm
    settings = isolated.settings.model_copy(update={"skill_roots": [str(CORPUS)]})
    unmatched = search(settings, client, query="zyxxy quorbl")
    assert not unmatched.is_error and "No skill matches" in unmatched.for_llm
    assert unmatched.metadata["results"] == [] and unmatched.metadata["skills"] == 20
    stopwords_only = search(settings, client, query="the and of")
    assert "No skill matches" in stopwords_only.for_llm


def test_names_are_split_into_words() -> None:
    assert tokenize("pdf-form-filler") == ["pdf", "form", "filler"]
    assert tokenize("PdfFormFiller") == ["pdf", "form", "filler"]
    assert tokenize("k8s_deploy") == ["k8s", "deploy"]
    assert tokenize("Resizing the images") == tokenize("resize image")


def test_malformed_skills_are_skipped_with_a_warning(
    isolated: Isolated, client: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "skills"
    write_skill(root, "good", "good-skill", "Convert temperature units between scales")
    (root / "no-front").mkdir()
    (root / "no-front" / "SKILL.md").write_text("# Just markdown\nconvert temperature\n")
    (root / "bad-yaml").mkdir()
    (root / "bad-yaml" / "SKILL.md").write_text(
        "---\nname: [unclosed\ndescription: convert temperature\n---\nbody\n"
    )
    (root / "unclosed").mkdir()
    (root / "unclosed" / "SKILL.md").write_text("---\nname: x\ndescription: temperature\n")
    (root / "list").mkdir()
    (root / "list" / "SKILL.md").write_text("---\n- a\n- b\n---\ntemperature\n")
    write_skill(root, "no-desc", "no-desc", "''")
    (root / "binary").mkdir()
    (root / "binary" / "SKILL.md").write_bytes(b"---\nname: \xff\xfe\ndescription: \x00\n---\n")
    write_skill(root, "dup", "good-skill", "Another skill claiming the same name, temperature")
    settings = isolated.settings.model_copy(update={"skill_roots": [str(root)]})
    with caplog.at_level(logging.WARNING, logger="clawq.skills"):
        result = search(settings, client, query="convert temperature")
    assert not result.is_error, result.for_llm
    assert [r["name"] for r in result.metadata["results"]] == ["good-skill"]
    assert result.metadata["skills"] == 1
    warned = " ".join(r.getMessage() for r in caplog.records)
    for folder in ("no-front", "bad-yaml", "unclosed", "list", "no-desc", "binary", "good"):
        assert f"/{folder}/SKILL.md" in warned, folder


def test_depth_links_and_hidden_folders(isolated: Isolated, client: Any, tmp_path: Path) -> None:
    root = tmp_path / "skills"
    write_skill(root, "team/tools/nested", "nested", "Rotate the office plants weekly")
    write_skill(root, "a/b/c/d/e/too-deep", "too-deep", "Rotate the office plants daily")
    write_skill(root, ".hidden", "hidden", "Rotate the office plants hourly")
    write_skill(root, "outer", "outer", "Water the office plants")
    write_skill(root, "outer/scripts/inner", "inner", "Rotate the office plants yearly")
    outside = tmp_path / "elsewhere"
    write_skill(outside, "linked", "linked", "Rotate the office plants monthly")
    (root / "linked").symlink_to(outside / "linked")
    settings = isolated.settings.model_copy(update={"skill_roots": [str(root)]})
    names = {r["name"] for r in search(settings, client, query="office plants").metadata["results"]}
    assert names == {"nested", "outer"}


def test_edit_and_add_change_results_in_every_process(
    isolated: Isolated, client: Any, skills: Path
) -> None:
    roots = [str(skills)]
    first, second = SkillIndex(roots), SkillIndex(roots)  # two worker processes
    query = "tune a guitar by ear"

    def top(index: SkillIndex) -> list[str]:
        return [h.skill.name for h in index.search(query, 5, client).hits]

    assert top(first) == [] and top(second) == []
    built_at = client.get(skill_index.VERSION_KEY)
    assert int(built_at) == 1  # the first process recorded the skills; the second agreed
    assert first.search(query, 5, client).rebuilt is False  # nothing changed: no rebuild

    # an edit: the translation skill now talks about guitars
    path = skills / "translation" / "SKILL.md"
    text = path.read_text().replace(
        "description: Translate documents", "description: Tune a guitar by ear, or translate"
    )
    path.write_text(text)
    assert top(first)[:1] == ["translation"]
    assert int(client.get(skill_index.VERSION_KEY)) == 2
    assert top(second)[:1] == ["translation"]
    assert int(client.get(skill_index.VERSION_KEY)) == 2  # one change, one bump

    # an addition, noticed first by the second process
    write_skill(skills, "guitar-tuning", "guitar-tuning", "Tune a guitar by ear with harmonics")
    assert top(second)[0] == "guitar-tuning"
    assert top(first)[0] == "guitar-tuning"
    assert int(client.get(skill_index.VERSION_KEY)) == 3

    # a removal
    shutil.rmtree(skills / "guitar-tuning")
    assert "guitar-tuning" not in top(first)
    assert "guitar-tuning" not in top(second)


def test_a_bumped_counter_rebuilds_a_process_whose_files_look_unchanged(
    isolated: Isolated, client: Any, skills: Path
) -> None:
    index = SkillIndex([str(skills)])
    index.search("pdf", 5, client)
    builds = index.builds
    path = skills / "pdf-form-filler" / "SKILL.md"
    st = path.stat()
    # content changes behind a restored mtime and size: the stat signature cannot see it
    original = path.read_text()
    changed = original.replace("Fill in fillable PDF", "Fill in fillable XYZ")
    assert len(changed) == len(original)
    path.write_text(changed)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert index.search("xyz", 5, client).hits == []  # still the old index
    assert index.builds == builds
    client.incr(keys.version("skills"))  # another process noticed the change
    assert [h.skill.name for h in index.search("xyz", 5, client).hits] == ["pdf-form-filler"]
    assert index.builds == builds + 1


def test_without_redis_the_index_follows_the_files(skills: Path) -> None:
    settings = Settings(skill_roots=[str(skills)])
    write_skill(skills, "bees", "beekeeping", "Inspect beehives for mites")
    assert search(settings, None, query="beehive mites").metadata["results"][0]["name"] == (
        "beekeeping"
    )
    (skills / "bees" / "SKILL.md").unlink()
    assert search(settings, None, query="beehive mites").metadata["results"] == []


def test_read_file_reads_inside_skill_roots_only_and_never_writes(
    isolated: Isolated, client: Any, skills: Path, workspace: Path, tmp_path: Path
) -> None:
    settings = isolated.settings.model_copy(update={"skill_roots": [str(skills)]})
    found = search(settings, client, query="fill a pdf form")
    path = found.metadata["results"][0]["path"]
    ctx = context(settings, client, str(workspace))

    read = run_tool(REGISTRY, "read_file", {"path": path, "limit": 3}, ctx)
    assert not read.is_error, read.for_llm
    assert "name: pdf-form-filler" in read.for_llm
    listed = run_tool(REGISTRY, "list_files", {"path": str(skills / "pdf-form-filler")}, ctx)
    assert not listed.is_error and "SKILL.md" in listed.for_llm
    relative = os.path.relpath(path, workspace)  # ../skills/pdf-form-filler/SKILL.md
    assert not run_tool(REGISTRY, "read_file", {"path": relative}, ctx).is_error

    before = Path(path).read_text()
    for name, args in [
        ("write_file", {"path": path, "content": "hijacked"}),
        ("write_file", {"path": str(skills / "new" / "SKILL.md"), "content": "x"}),
        ("edit_file", {"path": path, "old_string": "pdf-form-filler", "new_string": "x"}),
    ]:
        result = run_tool(REGISTRY, name, args, ctx)
        assert result.is_error and "outside the workspace" in result.for_llm, (name, result)
    assert Path(path).read_text() == before and not (skills / "new").exists()

    # outside the roots and the workspace: refused as before
    secret = tmp_path / "secret.txt"
    secret.write_text("no")
    assert run_tool(REGISTRY, "read_file", {"path": str(secret)}, ctx).is_error
    assert run_tool(
        REGISTRY, "read_file", {"path": str(skills / ".." / "secret.txt")}, ctx
    ).is_error
    # a link inside a root that points out of it is refused
    (skills / "escape.md").symlink_to(secret)
    escaped = run_tool(REGISTRY, "read_file", {"path": str(skills / "escape.md")}, ctx)
    assert escaped.is_error and "symlink" in escaped.for_llm
    # without roots configured, the same path is outside the workspace
    plain = context(isolated.settings, client, str(workspace))
    assert run_tool(REGISTRY, "read_file", {"path": path}, plain).is_error
