"""`slotkeeper model-info PATH`: a GGUF model's facts and the KV cache memory llama-server will
allocate for it, from the file's metadata only."""

from __future__ import annotations

import argparse
import json
import sys

from slotkeeper.cli.options import on_off, positive_int


def add_arguments(info: argparse.ArgumentParser) -> None:
    from slotkeeper.core.settings import ServerProfile

    defaults = ServerProfile()
    info.add_argument("path", metavar="PATH")
    info.add_argument("--ctx", type=positive_int, default=defaults.ctx, metavar="N",
                      help=f"total context (default {defaults.ctx}, the app's and serve's)")
    info.add_argument("--parallel", type=positive_int, default=1, metavar="N", help="slots (default 1)")
    info.add_argument("--ubatch", type=positive_int, default=512, metavar="N",
                      help="micro-batch (default 512)")
    info.add_argument("--cache-type-k", default="f16", metavar="T")
    info.add_argument("--cache-type-v", default="f16", metavar="T")
    info.add_argument("--unified", action="store_true", help="unified KV cache (-kvu)")
    info.add_argument("--flash-attn", type=on_off, default=True, metavar="on|off",
                      help="flash attention (default on, as llama-server's auto chooses on most devices)")
    info.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from slotkeeper.core.model import gguf_info, gguf_memory, gguf_text

    try:
        info = gguf_info.read_model_info(args.path)
        est = gguf_memory.kv_estimate(
            info,
            n_ctx=args.ctx,
            n_parallel=args.parallel,
            ubatch=args.ubatch,
            type_k=args.cache_type_k,
            type_v=args.cache_type_v,
            unified=args.unified,
            flash_attn=args.flash_attn,
        )
    except (gguf_info.ModelFileError, ValueError) as exc:
        print(f"slotkeeper: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(gguf_text.model_info_json(info, est), indent=2))
    else:
        print(gguf_text.format_model_info(info, est))
    return 0
