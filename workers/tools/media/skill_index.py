"""The skills index behind `skill_search`: the SKILL.md files of the configured skill
roots, parsed (Agent Skills front matter) and ranked with BM25 (`bm25s`).

**Ranking.** BM25 (`bm25s`, Lucene's variant, k1 1.5, b 0.75) over one document per
skill in which the fields are repeated by their weight (FIELD_REPEATS): the name three
times, the description twice, the body once. This is BM25F with one length normalisation:
a word's frequency is the weighted sum of its frequencies in the fields, saturated once,
with one IDF over whole skills - so a name or description word counts two or three times a
body word, yet a word is not rewarded twice for being in two fields, and a word found in
one description but in many bodies is not mistaken for a rare one. The alternative, a
weighted sum of three separate BM25 indexes (`3·bm25(name) + 2·bm25(desc) + bm25(body)`),
was measured worse: among twenty short descriptions nearly every word looks rare, so one
incidental word in a description ("polite", "manual", "formatting") outranked the skill the
query was about (17/20 against 20/20 on the test set, 16/20 against 18/20 on a second set of
queries written afterwards and kept out of the tests). Text is cut into words at anything
that is not a letter or a digit and at camelCase boundaries (`pdf-form-filler`,
`PdfFormFiller` → pdf, form, filler), lowercased, English stop words removed (bm25s's
NLTK-derived list) and Snowball-stemmed (PyStemmer), for documents and queries alike.

**Refresh.** Each process keeps its built index in memory with the version it was built
at. A search first takes a cheap signature of the roots: the (path, mtime_ns, size) of
every SKILL.md found. The index is rebuilt when that signature differs from the one it was
built from, or when the cluster's version counter in Redis (`clawq:version:skills`)
differs from its own. A rebuild reads the files and hashes their contents (paths relative
to their root, so hosts holding the same skills at other paths or mtimes agree); when that
digest differs from the one recorded in Redis and from this process's previous one, the
process records it and bumps the counter in one atomic step, so every other process
rebuilds at its next search, whether or not its own signature showed the change. Without
Redis the index still follows the files, by the signature alone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import bm25s
import numpy as np
import redis
import Stemmer
import yaml
from bm25s.stopwords import STOPWORDS_EN_PLUS

from broker import keys

log = logging.getLogger("clawq.skills")

SKILL_FILE = "SKILL.md"
MAX_DEPTH = 4  # folders below a root in which a skill folder may sit
MAX_SKILL_BYTES = 1024 * 1024
FIELD_REPEATS = {"name": 3, "description": 2, "body": 1}
TOPIC = "skills"
VERSION_KEY = keys.version(TOPIC)  # bumped (INCR) when any process sees the skills change
SIGNATURE_KEY = f"{keys.PREFIX}:skills:signature"  # the content digest that version is for

_BUMP = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[1])
  local v = redis.call('INCR', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3] .. ':' .. v)
  return v
end
return tonumber(redis.call('GET', KEYS[1]) or '0')
"""

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORD = re.compile(r"[^\W_]+")
_STOPWORDS = frozenset(STOPWORDS_EN_PLUS)


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    return Stemmer.Stemmer("english")


def tokenize(text: str) -> list[str]:
    """Words of `text` as the index sees them: split, lowercased, stop words out, stemmed."""
    words = [w.lower() for w in _WORD.findall(_CAMEL.sub(" ", text))]
    kept = [w for w in words if w not in _STOPWORDS and (len(w) > 1 or w.isdigit())]
    return list(_stemmer().stemWords(kept)) if kept else []


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    path: str  # the real path of its SKILL.md
    body: str


@dataclass(frozen=True)
class Hit:
    skill: Skill
    score: float


@dataclass(frozen=True)
class SkillFile:
    root: int  # index of its root in the configured list
    relative: str  # its path relative to that root
    path: str  # real absolute path
    mtime_ns: int
    size: int


def find_skill_files(roots: list[str]) -> list[SkillFile]:
    """Every SKILL.md in the roots, at most MAX_DEPTH folders down, in root order.
    Links are not followed (a skill must really be inside its root, where read_file may
    read it); hidden folders and a skill's own subfolders are not searched."""
    found: list[SkillFile] = []
    for number, root in enumerate(roots):
        top = os.path.realpath(os.path.expanduser(root))
        if not os.path.isdir(top):
            continue
        for folder, dirs, files in os.walk(top, followlinks=False):
            depth = 0 if folder == top else os.path.relpath(folder, top).count(os.sep) + 1
            if SKILL_FILE in files:
                dirs[:] = []  # its scripts/, references/: not skills of their own
                full = os.path.join(folder, SKILL_FILE)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                    rel = os.path.relpath(full, top)
                    found.append(SkillFile(number, rel, full, st.st_mtime_ns, st.st_size))
                else:
                    log.warning("skill %s is a link or has hard links; skipped", full)
                continue
            dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < MAX_DEPTH else []
    return found


def parse_skill(path: str, text: str) -> Skill | None:
    """A skill from a SKILL.md's text, or None (with a warning) when its front matter is
    missing or malformed."""
    lines = text.removeprefix("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        log.warning("skill %s: no front matter (a first line '---'); skipped", path)
        return None
    end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), None)
    if end is None:
        log.warning("skill %s: front matter is not closed by '---'; skipped", path)
        return None
    try:
        meta = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as exc:
        log.warning("skill %s: front matter is not valid YAML (%s); skipped", path, exc)
        return None
    if not isinstance(meta, dict):
        log.warning("skill %s: front matter is not a mapping; skipped", path)
        return None
    name, description = meta.get("name"), meta.get("description")
    if not isinstance(name, str) or not name.strip():
        log.warning("skill %s: front matter has no name; skipped", path)
        return None
    if not isinstance(description, str) or not description.strip():
        log.warning("skill %s: front matter has no description; skipped", path)
        return None
    body = "\n".join(lines[end + 1 :]).strip()
    return Skill(name.strip(), " ".join(description.split()), path, body)


def load_skills(files: list[SkillFile]) -> tuple[list[Skill], str]:
    """The skills of these files (the first of each name wins) and a digest of the files'
    contents that does not depend on where the roots are."""
    digest = hashlib.sha256()
    skills: list[Skill] = []
    names: dict[str, str] = {}
    for f in files:
        try:
            with open(f.path, "rb") as fh:
                data = fh.read(MAX_SKILL_BYTES + 1)
        except OSError as exc:
            log.warning("skill %s: cannot read it (%s); skipped", f.path, exc.strerror)
            continue
        digest.update(f"{f.root}\0{f.relative}\0".encode())
        digest.update(hashlib.sha256(data).digest())
        if len(data) > MAX_SKILL_BYTES:
            log.warning("skill %s is larger than %d bytes; skipped", f.path, MAX_SKILL_BYTES)
            continue
        skill = parse_skill(f.path, data.decode("utf-8", errors="replace"))
        if skill is None:
            continue
        if skill.name in names:
            log.warning(
                "skill %s: name %s is taken by %s; skipped", f.path, skill.name, names[skill.name]
            )
            continue
        names[skill.name] = f.path
        skills.append(skill)
    return skills, digest.hexdigest()


def document(skill: Skill) -> list[str]:
    """A skill's tokens as BM25 sees them: each field repeated by its weight."""
    fields = {"name": skill.name, "description": skill.description, "body": skill.body}
    return [t for f, n in FIELD_REPEATS.items() for t in tokenize(fields[f]) * n]


class Ranker:
    """BM25 over a set of skills, their fields weighted (see the module's docstring)."""

    def __init__(self, skills: list[Skill]) -> None:
        self.skills = skills
        self.model: bm25s.BM25 | None = None
        docs = [document(s) for s in skills]
        if any(docs):  # with no token at all there is nothing to score (nor an average length)
            self.model = bm25s.BM25()
            self.model.index(docs, show_progress=False)

    def search(self, query: str, limit: int) -> list[Hit]:
        terms = list(dict.fromkeys(tokenize(query)))
        if self.model is None or not terms:
            return []
        ids = [self.model.vocab_dict[t] for t in terms if t and t in self.model.vocab_dict]
        if not ids:
            return []
        total = np.asarray(self.model.get_scores_from_ids(ids), dtype=np.float64)
        order = sorted(
            (i for i in range(len(self.skills)) if total[i] > 0),
            key=lambda i: (-total[i], self.skills[i].name),
        )
        return [Hit(self.skills[i], float(total[i])) for i in order[:limit]]


@dataclass
class Searched:
    hits: list[Hit]
    skills: int  # how many are indexed
    version: int
    rebuilt: bool


@dataclass
class SkillIndex:
    """One process's index of a list of roots, kept fresh as the module docstring says."""

    roots: list[str]
    version: int = 0
    signature: tuple[tuple[str, int, int], ...] | None = None
    digest: str | None = None
    ranker: Ranker = field(default_factory=lambda: Ranker([]))
    builds: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def search(self, query: str, limit: int, client: redis.Redis | None) -> Searched:
        with self.lock:
            rebuilt = self.refresh(client)
            ranker, version = self.ranker, self.version
        return Searched(ranker.search(query, limit), len(ranker.skills), version, rebuilt)

    def refresh(self, client: redis.Redis | None) -> bool:
        """Rebuild if the files or the cluster's version say so; whether it rebuilt."""
        files = find_skill_files(self.roots)
        signature = tuple((f.path, f.mtime_ns, f.size) for f in files)
        remote_version, remote_digest = self._remote(client)
        fresh = self.signature == signature and (
            remote_version is None or remote_version == self.version
        )
        if fresh:
            return False
        skills, digest = load_skills(files)
        if remote_version is None or client is None:
            version = self.version + (digest != self.digest)
        elif digest != remote_digest and digest != self.digest:
            version = self._bump(client, digest, remote_version)
        else:
            version = remote_version
        self.ranker = Ranker(skills)
        self.signature, self.digest, self.version = signature, digest, version
        self.builds += 1
        log.info("skills index: %d skills, version %d", len(skills), version)
        return True

    @staticmethod
    def _remote(client: redis.Redis | None) -> tuple[int | None, str | None]:
        if client is None:
            return None, None
        try:
            raw_version, raw_digest = client.mget([VERSION_KEY, SIGNATURE_KEY])
        except redis.RedisError as exc:
            log.warning("skills index: Redis unavailable (%s); following the files only", exc)
            return None, None
        digest = raw_digest.decode() if isinstance(raw_digest, bytes) else raw_digest
        return int(raw_version or 0), digest

    @staticmethod
    def _bump(client: redis.Redis, digest: str, fallback: int) -> int:
        try:
            return int(
                client.eval(
                    _BUMP, 2, VERSION_KEY, SIGNATURE_KEY, digest, keys.CHANGES_CHANNEL, TOPIC
                )
            )
        except redis.RedisError as exc:
            log.warning("skills index: cannot record the change in Redis (%s)", exc)
            return fallback + 1


_indexes: dict[tuple[str, ...], SkillIndex] = {}
_indexes_lock = threading.Lock()


def index_for(roots: list[str]) -> SkillIndex:
    """This process's index of these roots (one per distinct list)."""
    key = tuple(roots)
    with _indexes_lock:
        index = _indexes.get(key)
        if index is None:
            index = _indexes[key] = SkillIndex(list(roots))
        return index
