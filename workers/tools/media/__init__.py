"""media: speech (tts), pictures (image) and the skills index (skill_search); the seed's
"other tools", on the `media` queue."""

from workers.tools.media import image, skills, tts

TOOLS = [*tts.TOOLS, *image.TOOLS, *skills.TOOLS]
