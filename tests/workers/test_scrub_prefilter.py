"""The scrubber's RE2 prefilter may only let Python's engine try more, never less: every
character a rule's pattern takes, RE2's translation takes too; a text a rule matches reaches
that rule; and trying it only where RE2 points finds what `finditer` finds."""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from re import _compiler, _parser
from re import _constants as sre
from types import SimpleNamespace
from typing import Any

import pytest
import re2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workers.scrub import REDACTED, Scrubber, _re2, prefilter, re2_superset, rules

ATOMS = (sre.LITERAL, sre.NOT_LITERAL, sre.IN, sre.CATEGORY, sre.ANY)
# every character Python can hold in a str that UTF-8 can carry (no lone surrogates)
EVERY_CHARACTER = "".join(chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF)


def atoms(items: Any, flags: int) -> Iterator[tuple[Any, Any, int]]:
    """Every one-character matcher in a parsed pattern, with the flags it runs under."""
    for op, av in items:
        if op in ATOMS:
            yield op, av, flags
        elif op is sre.BRANCH:
            for branch in av[1]:
                yield from atoms(branch, flags)
        elif op is sre.SUBPATTERN:
            yield from atoms(av[3], (flags | av[1]) & ~av[2])
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            yield from atoms(av[2], flags)
        elif op in (sre.ATOMIC_GROUP, sre.ASSERT, sre.ASSERT_NOT):
            yield from atoms(av if op is sre.ATOMIC_GROUP else av[1], flags)


def distinct_atoms() -> dict[str, tuple[Any, Any, int]]:
    found = {}
    for pattern, _ in rules():
        parsed = _parser.parse(pattern.pattern, pattern.flags)
        for op, av, flags in atoms(parsed, parsed.state.flags):
            found[repr((op, av, flags & (re.I | re.S)))] = (op, av, flags)
    return found


@pytest.mark.parametrize("key", sorted(distinct_atoms()))
def test_every_character_a_rules_matcher_takes_its_translation_takes(key: str) -> None:
    """All 1.1 million characters, through each one-character matcher of every rule: what
    Python's engine takes (Unicode classes, case folding), RE2's translation takes too."""
    op, av, flags = distinct_atoms()[key]
    state = _parser.State()
    state.flags = flags
    python = _compiler.compile(_parser.SubPattern(state, [(op, av)]), flags)
    form = _re2([(op, av)], flags)
    taken = "".join(python.findall(EVERY_CHARACTER))
    assert taken, "the matcher takes some character"
    if not re2.compile(f"(?:{form})*").fullmatch(taken):
        missed = [c for c in taken if not re2.compile(form).fullmatch(c)]
        raise AssertionError(f"RE2 misses {missed[:10]} of {len(missed)}")


def test_every_rule_is_translated() -> None:
    """A rule RE2 cannot take would be tried everywhere: none is, today."""
    untranslated = [p.pattern for p, _ in rules() if re2_superset(p) is None]
    assert untranslated == []
    assert prefilter().always == []
    assert sorted(prefilter().near) == list(range(len(rules())))


def spans(matches: Iterable[re.Match[str]]) -> list[tuple[int, int]]:
    return [m.span() for m in matches]


@pytest.mark.parametrize("index", range(len(rules())))
@settings(
    max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(data=st.data())
def test_a_text_a_rule_matches_reaches_that_rule_and_its_matches(
    index: int, data: st.DataObject
) -> None:
    """Texts made of matches of the rule inside any other text: the prefilter names the
    rule, and trying Python's engine only where RE2 points finds what `finditer` finds."""
    pattern = rules()[index][0]
    parts = data.draw(
        st.lists(
            st.one_of(st.from_regex(pattern, fullmatch=True), st.text(max_size=12)),
            min_size=1,
            max_size=5,
        )
    )
    inner = data.draw(st.from_regex(pattern, fullmatch=True))
    assert index in dict(prefilter().matches(inner))
    text = "".join(parts) + inner  # (a part can take a \b from the next: no match then)
    found = dict(prefilter().matches(text))
    if pattern.search(text):
        assert index in found
    assert spans(found.get(index, ())) == spans(pattern.finditer(text))


def every_rule(text: str) -> str:
    """The scrubber with every rule tried at every position: as before the prefilter."""
    unfiltered = Scrubber(["hunter2-literal"])
    unfiltered.prefilter = SimpleNamespace(matches=prefilter().everywhere)  # type: ignore[assignment]
    return unfiltered(text)


def corpus() -> list[str]:
    from tests.workers import test_scrub

    marks = {m.name: m for m in test_scrub.test_secrets_are_redacted.pytestmark}
    secrets = [text for text, _ in marks["parametrize"].args[1]]
    prose = list(
        {m.name: m for m in test_scrub.test_prose_is_left_alone.pytestmark}["parametrize"].args[1]
    )
    root = Path(__file__).parents[2]
    folders = ("broker", "workers", "orchestrator", "tests")
    sources = [f.read_text() for d in folders for f in sorted((root / d).glob("**/*.py"))[::4]]
    rng = random.Random(7)
    shuffled = [" ".join(rng.sample(secrets + prose, 8)) for _ in range(50)]
    return [*secrets, *prose, *sources, *shuffled]


def test_the_scrubber_redacts_what_every_rule_run_redacts() -> None:
    """The repository's sources, the secret and prose corpus, and mixes of them: the same
    output, whichever rules the prefilter let run."""
    texts = corpus()
    assert sum(REDACTED in every_rule(t) for t in texts) > 50
    scrub = Scrubber(["hunter2-literal"])
    for text in texts:
        assert scrub(text) == every_rule(text)


def test_a_text_with_a_lone_surrogate_runs_every_rule() -> None:
    text = "token ghp_" + "a" * 36 + " \udcff"
    assert [i for i, _ in prefilter().matches(text)] == list(range(len(rules())))
    assert REDACTED in Scrubber()(text)
