"""skill_search: find the skills (folders with a SKILL.md, in CLAWQ_SKILL_ROOTS) that fit a
task, ranked with BM25 over their names, descriptions and bodies (`skill_index`). The model
then reads the chosen SKILL.md with read_file, which may read inside the skill roots."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from broker.protocol import Group
from workers.tool import SideEffect, Tool, ToolContext, ToolInput, ToolResult

MAX_DESCRIPTION_CHARS = 500


class SkillSearchInput(ToolInput):
    query: str = Field(
        min_length=1,
        max_length=1000,
        description="What you want to do, in a few words (e.g. 'fill in a PDF form')",
    )
    limit: int | None = Field(
        None, ge=1, description="At most this many skills (capped by the configured maximum)"
    )


def _short(text: str) -> str:
    if len(text) <= MAX_DESCRIPTION_CHARS:
        return text
    return text[: MAX_DESCRIPTION_CHARS - 1].rstrip() + "…"


class SkillSearch(Tool[SkillSearchInput]):
    name = "skill_search"
    description = (
        "Search the available skills (instructions for specific kinds of task, each in a "
        "SKILL.md) by what you want to do. Returns the best matches with their name, "
        "description and path; read the SKILL.md with read_file to use a skill."
    )
    group = Group.media
    input_model = SkillSearchInput
    side_effect = SideEffect.read
    default_permission = "allow"
    timeout_s = 30.0

    def summary(self, args: SkillSearchInput) -> str:
        return f"skill_search({args.query[:60]})"

    def concurrency_safe(self, args: SkillSearchInput) -> bool:
        return True

    def run(self, args: SkillSearchInput, ctx: ToolContext) -> ToolResult:
        roots = ctx.settings.skill_roots
        if not roots:
            return ToolResult(
                for_llm="No skills are configured here (CLAWQ_SKILL_ROOTS is empty).",
                metadata={"results": [], "skills": 0},
            )
        cap = ctx.settings.skill_search_max_results
        limit = min(args.limit or cap, cap)
        # imported here: BM25 brings numpy (24 MB) into every process that lists this tool
        from workers.tools.media.skill_index import index_for

        found = index_for(roots).search(args.query, limit, ctx.redis)
        meta: dict[str, Any] = {"skills": found.skills, "version": found.version}
        if not found.skills:
            return ToolResult(
                for_llm=f"No skills found in the skill roots ({', '.join(roots)}).",
                metadata={**meta, "results": []},
            )
        if not found.hits:
            return ToolResult(
                for_llm=(
                    f"No skill matches '{args.query}' ({found.skills} skills indexed); "
                    "try other words for the task."
                ),
                metadata={**meta, "results": []},
            )
        results = [
            {
                "name": h.skill.name,
                "description": h.skill.description,
                "path": h.skill.path,
                "score": round(h.score, 2),
            }
            for h in found.hits
        ]
        lines = [f"{len(results)} of {found.skills} skills match '{args.query}', best first:"]
        for n, r in enumerate(results, 1):
            lines.append(f"{n}. {r['name']} (score {r['score']}): {_short(str(r['description']))}")
            lines.append(f"   {r['path']}")
        lines.append(
            "To use a skill, read its SKILL.md with read_file (the path above) and follow "
            "its instructions."
        )
        return ToolResult(
            for_llm="\n".join(lines),
            for_user=f"skill_search: {', '.join(str(r['name']) for r in results)}",
            metadata={**meta, "results": results},
        )


TOOLS: list[type[Tool[Any]]] = [SkillSearch]
