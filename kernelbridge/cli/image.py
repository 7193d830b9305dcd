"""``kernelbridge image build|status|save|load``, in the image store of the selected runtime (the one
``serve`` would use: local, remote or several engines)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from kernelbridge.config import IMAGE_PROFILES, Settings

if TYPE_CHECKING:
    from kernelbridge.cli.command import Subcommands
    from kernelbridge.image import ImageContents
    from kernelbridge.runtime import RuntimeBackend


def add_parsers(sub: Subcommands) -> None:
    image = sub.add_parser("image", help="manage the sandbox image")
    image_sub = image.add_subparsers(dest="image_command", required=True, metavar="ACTION")
    profile = argparse.ArgumentParser(add_help=False)
    profile.add_argument("--profile", choices=IMAGE_PROFILES,
                         help="its package set (default: KERNELBRIDGE_IMAGE_PROFILE, else full)")  # fmt: skip
    build = image_sub.add_parser(
        "build", parents=[profile], help="build the sandbox image (no container registry needed)"
    )
    build.add_argument("--force", action="store_true", help="rebuild even if the image is current")
    build.add_argument("--containerfile", action="store_true",
                       help="build from sandbox_kernel_image/Containerfile (needs a registry)")  # fmt: skip
    build.add_argument("--with", dest="packages", action="append", default=[], metavar="PACKAGE",
                       help="add a Python package to the image (repeatable)")  # fmt: skip
    image_sub.add_parser(
        "status", parents=[profile], help="say whether the image is current, stale or missing"
    )
    save = image_sub.add_parser(
        "save", parents=[profile], help="write the current image to a file (for `image load` elsewhere)"
    )
    save.add_argument("file", type=Path, metavar="FILE", help="the docker-archive tarball to write")
    load = image_sub.add_parser("load", help="load an image file made by `image save` (instead of a build)")
    load.add_argument("file", type=Path, metavar="FILE", help="a docker-archive tarball")
    image.set_defaults(run=cmd_image)


def cmd_image(args: argparse.Namespace, settings: Settings) -> int:
    return anyio.run(_image, args, settings)


async def _image(args: argparse.Namespace, settings: Settings) -> int:
    from kernelbridge.image import contents_from_settings
    from kernelbridge.runtime import open_runtime

    contents = contents_from_settings(settings).with_profile(getattr(args, "profile", None))
    async with open_runtime(settings) as runtime:
        if args.image_command == "status":
            return await _status(runtime, settings, contents)
        if args.image_command == "save":
            return await _save(runtime, settings, contents, args.file)
        if args.image_command == "load":
            return await _load(runtime, settings, contents, args.file)
        return await _build(runtime, settings, contents, args)


async def _status(runtime: RuntimeBackend, settings: Settings, contents: ImageContents) -> int:
    from kernelbridge.image import (
        PACKAGES_LABEL,
        VERSION_LABEL,
        agent_hash,
        check_labels,
        default_image,
        image_status,
        parse_packages,
    )

    if settings.image:  # used as given: only its agent matters (raises ImageError if wrong)
        labels = await runtime.images.labels(settings.image)
        check_labels(settings.image, labels, agent_hash())
        assert labels is not None
        packages = parse_packages(labels.get(PACKAGES_LABEL))
        print(
            f"{settings.image}: usable (KERNELBRIDGE_IMAGE; the agent of kernelbridge"
            f" {labels.get(VERSION_LABEL, '?')}"
            + (f"; {' '.join(packages)}" if packages else "; no kernelbridge.packages label")
            + ")"
        )
        return 0
    image = default_image(contents)
    status = await image_status(runtime.images, image, contents)
    print(f"{image}: {status}")
    return 0 if status == "current" else 1


async def _build(
    runtime: RuntimeBackend, settings: Settings, contents: ImageContents, args: argparse.Namespace
) -> int:
    from kernelbridge.image import build_image

    wanted = contents.plus(args.packages)
    tag = await build_image(
        runtime.images, force=args.force, containerfile=args.containerfile, contents=wanted
    )
    if settings.image:
        print(f"note: KERNELBRIDGE_IMAGE={settings.image} is set, so bridges use that image, not {tag}")
    else:
        # The bridge finds the image by the configured profile and packages: say how to configure them.
        hint = _settings_line(settings, wanted)
        if hint:
            print(f"to use it, give `kernelbridge serve` {hint}")
    return 0


async def _save(runtime: RuntimeBackend, settings: Settings, contents: ImageContents, file: Path) -> int:
    from kernelbridge.errors import ImageError
    from kernelbridge.image import agent_hash, default_image, image_status
    from kernelbridge.image.archive import save_image

    image = settings.image or default_image(contents)
    if not settings.image and (status := await image_status(runtime.images, image, contents)) != "current":
        raise ImageError(f"the sandbox image {image} is {status}; build it with `kernelbridge image build`")
    started = anyio.current_time()
    size = await save_image(runtime.images, image, file, agent_hash())
    print(f"saved {image} to {file} ({size / 1e6:.0f} MB in {anyio.current_time() - started:.1f} s)")
    return 0


async def _load(runtime: RuntimeBackend, settings: Settings, contents: ImageContents, file: Path) -> int:
    from kernelbridge.image import ImageContents, agent_hash, default_image
    from kernelbridge.image.archive import load_image

    loaded = await load_image(runtime.images, file, agent_hash())
    print(f"loaded {loaded.tag} from {file} in {loaded.seconds:.1f} s")
    if settings.image:
        print(f"note: KERNELBRIDGE_IMAGE={settings.image} is set: bridges use that image, not {loaded.tag}")
    elif loaded.tag == default_image(contents):
        print(f"{loaded.tag}: current (bridges with these settings use it)")
    else:
        # A profile's image without extras can be named by settings; any other by its tag.
        plain = [ImageContents(p) for p in IMAGE_PROFILES if default_image(ImageContents(p)) == loaded.tag]
        hint = _settings_line(settings, plain[0]) if plain else f"KERNELBRIDGE_IMAGE={loaded.tag}"
        print(
            f"{loaded.tag} is not the image of these settings (they expect {default_image(contents)});"
            f" bridges use it with {hint}"
        )
    return 0


def _settings_line(settings: Settings, contents: ImageContents) -> str:
    """The settings that make a bridge expect the image of ``contents`` where they are not
    ``settings``' own (empty: they are)."""
    from kernelbridge.image import contents_from_settings

    configured = contents_from_settings(settings)
    parts = []
    if contents.profile != configured.profile:
        parts.append(f"KERNELBRIDGE_IMAGE_PROFILE={contents.profile}")
    if contents.extras != configured.extras:
        parts.append(f"KERNELBRIDGE_IMAGE_PACKAGES={shlex.quote(' '.join(contents.extras))}")
    return " ".join(parts)
