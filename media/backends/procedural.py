"""The default image backend: abstract art drawn from the prompt with Pillow, no weights.

Same prompt, same picture: every choice comes from a generator seeded by the prompt. The
picture is built in steps (background, shapes from large to small, then a caption with the
prompt), each followed by a configurable pause, so a worker shows real progress and the
browser's pending state is visible even though drawing itself takes milliseconds.
"""

from __future__ import annotations

import colorsys
import random
import textwrap
import time

from PIL import Image, ImageDraw, ImageFont

from media.backends.base import Progress, png_bytes

Color = tuple[int, int, int]


class ProceduralBackend:
    """Deterministic PNGs in `steps` steps of `step_delay` seconds each."""

    def __init__(self, steps: int, step_delay: float, size: int = 512) -> None:
        self.steps = steps
        self.step_delay = step_delay
        self.size = size

    def render(self, prompt: str, *, seed: int, on_progress: Progress) -> bytes:
        rng = random.Random(seed)
        palette = make_palette(rng)
        canvas = gradient(self.size, palette[0], palette[1])
        for step in range(1, self.steps + 1):
            # Early steps lay down large shapes, later ones smaller details.
            scale = 1 - 0.8 * (step - 1) / max(self.steps - 1, 1)
            canvas = draw_shapes(canvas, rng, palette, scale)
            if step == self.steps:
                canvas = draw_caption(canvas, prompt)
            time.sleep(self.step_delay)
            on_progress(step / self.steps)
        return png_bytes(canvas.convert("RGB"))


def make_palette(rng: random.Random) -> list[Color]:
    """Five related colours around a random hue: two for the sky, three for shapes."""
    hue = rng.random()
    offsets = [0.0, 0.08, 0.5, 0.58, 0.33]
    colors = []
    for offset in offsets:
        saturation = rng.uniform(0.35, 0.85)
        value = rng.uniform(0.45, 0.95)
        r, g, b = colorsys.hsv_to_rgb((hue + offset) % 1.0, saturation, value)
        colors.append((round(r * 255), round(g * 255), round(b * 255)))
    return colors


def gradient(size: int, top: Color, bottom: Color) -> Image.Image:
    """A vertical blend from `top` to `bottom`."""
    column = Image.new("RGBA", (1, size))
    for y in range(size):
        t = y / max(size - 1, 1)
        column.putpixel(
            (0, y), tuple(round(a + (b - a) * t) for a, b in zip(top, bottom, strict=True)) + (255,)
        )
    return column.resize((size, size))


def draw_shapes(
    canvas: Image.Image, rng: random.Random, palette: list[Color], scale: float
) -> Image.Image:
    """Composite a few translucent circles, rectangles and triangles onto the canvas."""
    size = canvas.width
    layer = Image.new("RGBA", canvas.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    for _ in range(rng.randint(2, 4)):
        color = rng.choice(palette[2:]) + (rng.randint(70, 170),)
        radius = rng.uniform(0.05, 0.3) * size * scale
        x, y = rng.uniform(0, size), rng.uniform(0, size)
        box = (x - radius, y - radius, x + radius, y + radius)
        kind = rng.choice(("circle", "rectangle", "triangle"))
        if kind == "circle":
            draw.ellipse(box, fill=color)
        elif kind == "rectangle":
            draw.rounded_rectangle(box, radius=radius / 4, fill=color)
        else:
            draw.polygon(
                [(x, y - radius), (x - radius, y + radius), (x + radius, y + radius)], fill=color
            )
    return Image.alpha_composite(canvas, layer)


def draw_caption(canvas: Image.Image, prompt: str) -> Image.Image:
    """The prompt's first words on a translucent band along the bottom."""
    size = canvas.width
    font = ImageFont.load_default(size=max(size // 28, 10))
    lines = textwrap.wrap(" ".join(prompt.split()), width=40, max_lines=2, placeholder=" …")
    if not lines:
        return canvas
    line_height = font.size * 1.3
    band_top = size - line_height * len(lines) - font.size
    layer = Image.new("RGBA", canvas.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    draw.rectangle((0, band_top, size, size), fill=(0, 0, 0, 120))
    for number, line in enumerate(lines):
        y = band_top + font.size / 2 + number * line_height
        draw.text((font.size, y), line, font=font, fill=(255, 255, 255, 235))
    return Image.alpha_composite(canvas, layer)
