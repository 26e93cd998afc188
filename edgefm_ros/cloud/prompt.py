"""The prompt of a scene question, the same on the robot's edge engine (placement/vqa.py) and on the cloud
server (tasks/vqa.py), so that a greedy cloud answer is the edge's; shared by both tiers like images.py."""
from __future__ import annotations

from typing import Any


def vqa_messages(question: str, n_images: int, system: str | None = None) -> list[dict]:
    """Chat messages of a scene question: [system], user (``n_images`` image markers, then the text)."""
    content: Any = question
    if n_images:
        content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": question}]
    user = {"role": "user", "content": content}
    return [{"role": "system", "content": system}, user] if system else [user]
