"""``kernelbridge image build|status``, in the image store of the selected runtime (the one
``serve`` would use: local, remote or several engines)."""

from __future__ import annotations

import argparse
import shlex
from typing import TYPE_CHECKING

import anyio

from kernelbridge.config import Settings

if TYPE_CHECKING:
    from kernelbridge.cli.command import Subcommands


def add_parsers(sub: Subcommands) -> None:
    image = sub.add_parser("image", help="manage the sandbox image")
    image_sub = image.add_subparsers(dest="image_command", required=True, metavar="ACTION")
    build = image_sub.add_parser("build", help="build the sandbox image (no container registry needed)")
    build.add_argument("--force", action="store_true", help="rebuild even if the image is current")
    build.add_argument("--containerfile", action="store_true",
                       help="build from sandbox_kernel_image/Containerfile (needs a registry)")  # fmt: skip
    build.add_argument("--with", dest="packages", action="append", default=[], metavar="PACKAGE",
                       help="add a Python package to the image (repeatable)")  # fmt: skip
    image_sub.add_parser("status", help="say whether the image is current, stale or missing")
    image.set_defaults(run=cmd_image)


def cmd_image(args: argparse.Namespace, settings: Settings) -> int:
    return anyio.run(_image, args, settings)


async def _image(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.image import (
        agent_hash,
        build_image,
        check_labels,
        default_image,
        extras_from_settings,
        image_status,
    )
    from kernelbridge.runtime import open_runtime

    extras = extras_from_settings(settings)
    wanted = extras.plus(args.packages) if args.image_command == "build" else extras
    async with open_runtime(settings) as runtime:
        if args.image_command == "status":
            if settings.image:  # used as given: only its agent matters (raises ImageError if wrong)
                check_labels(settings.image, await runtime.images.labels(settings.image), agent_hash())
                print(f"{settings.image}: usable (KERNELBRIDGE_IMAGE)")
                return 0
            image = default_image(extras)
            status = await image_status(runtime.images, image, extras)
            print(f"{image}: {status}")
            return 0 if status == "current" else 1
        tag = await build_image(
            runtime.images, force=args.force, containerfile=args.containerfile, extras=wanted
        )
    if settings.image:
        print(f"note: KERNELBRIDGE_IMAGE={settings.image} is set, so bridges use that image, not {tag}")
    elif wanted != extras:
        # The bridge finds the image by the configured packages: say how to configure them.
        packages = " ".join(wanted.requirements)
        print(f"to use it, give `kernelbridge serve` KERNELBRIDGE_IMAGE_PACKAGES={shlex.quote(packages)}")
    return 0
