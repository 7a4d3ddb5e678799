"""twistd plugin: ``twistd -n nvpair --engine ollama``."""

from twisted.application.service import ServiceMaker

nvpair = ServiceMaker(
    "nvpair",
    "nvpair_tw.tap",
    "Failover reverse proxy for local LLM inference engines (ollama, lmstudio, omlx).",
    "nvpair",
)
