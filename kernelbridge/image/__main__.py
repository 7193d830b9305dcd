"""``python -m kernelbridge.image [--force] [--containerfile] [--profile P] [--with PKG] [--runtime R]``:
ensure the sandbox image in the selected runtime's image store (``--force`` rebuilds it)."""

from __future__ import annotations

import argparse
import os
import sys

import anyio

from kernelbridge.config import IMAGE_PROFILES, Settings, load_settings
from kernelbridge.errors import KernelBridgeError
from kernelbridge.image.build import build_image
from kernelbridge.image.recipe import ImageContents, contents_from_settings
from kernelbridge.runtime import open_runtime


async def _build(settings: Settings, contents: ImageContents, force: bool, containerfile: bool) -> None:
    async with open_runtime(settings) as runtime:
        await build_image(runtime.images, force=force, containerfile=containerfile, contents=contents)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernelbridge.image", description=__doc__)
    parser.add_argument("--force", action="store_true", help="rebuild even if the image is current")
    parser.add_argument(
        "--containerfile", action="store_true", help="build the Containerfile (needs a registry)"
    )
    parser.add_argument("--with", dest="extra", action="append", default=[], metavar="PACKAGE",
                        help="add a Python package to the image (repeatable)")  # fmt: skip
    parser.add_argument("--profile", choices=IMAGE_PROFILES,
                        help="its package set (default: KERNELBRIDGE_IMAGE_PROFILE, else full)")  # fmt: skip
    parser.add_argument("--runtime", help="KERNELBRIDGE_RUNTIME for this build (default: the settings)")
    args = parser.parse_args(argv)
    try:
        env = {**os.environ, **({"KERNELBRIDGE_RUNTIME": args.runtime} if args.runtime else {})}
        settings = load_settings(env)
        contents = contents_from_settings(settings).with_profile(args.profile).plus(args.extra)
        anyio.run(_build, settings, contents, args.force, args.containerfile)
    except KernelBridgeError as exc:
        print(f"kernelbridge: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
