"""Command line export of a model spec to an HF-format folder.

    python -m jaxrl_mt.export --model builtin:smollm2-135m-instruct --out /tmp/smollm2 [--dtype bfloat16]

SPEC is anything `jaxrl_mt.models.registry.load_model` accepts: `builtin:NAME`, `random:NAME`
(random weights, the embedded model's tokenizer), a local HF folder or a hub id. The folder holds
config.json, model.safetensors, generation_config.json and the tokenizer files (when the source
has a tokenizer), and loads in transformers as is. On a bad spec or checkpoint, or an unwritable
or full ``--out``, the command prints one line to stderr and exits with status 2. The folder is
written beside ``--out`` and renamed into place: a failed export leaves an existing folder there as
it was.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from jaxrl_mt.cli_errors import check_writable_dir, one_line
from jaxrl_mt.models.config import ModelError

DTYPES = ("float32", "bfloat16")
EXIT_BAD_INPUT = 2
# A folder holding any of these has a tokenizer to export with the weights.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def export_model(spec: str, out_dir: str | Path, *, dtype: str = "float32") -> Path:
    """Loads `spec` and writes it as an HF folder at `out_dir` with parameters in `dtype`.

    Args:
      spec: model spec (builtin:NAME, local folder or hub id).
      out_dir: destination folder (replaced atomically if it exists).
      dtype: parameter dtype of the written safetensors ("float32" or "bfloat16").

    Returns:
      The written folder.

    Raises:
      ModelError: the spec or its checkpoint cannot be used.
    """
    from jaxrl_mt.models.hf_io import export_hf_folder
    from jaxrl_mt.models.registry import load_model, load_tokenizer, resolve
    from jaxrl_mt.models.synthetic import PREFIX

    if dtype not in DTYPES:
        raise ModelError(f"unsupported dtype {dtype!r}; expected one of {DTYPES}")
    if spec.startswith(PREFIX):  # random weights made in memory, with the embedded model's tokenizer
        model = load_model(spec, param_dtype=dtype, dtype=dtype)
        return export_hf_folder(model.cfg, model.params, out_dir, tokenizer=model.tokenizer)
    folder = resolve(spec)
    model = load_model(str(folder), param_dtype=dtype, dtype=dtype, with_tokenizer=False)
    tokenizer = None
    if any((folder / name).is_file() for name in TOKENIZER_FILES):
        try:
            tokenizer = load_tokenizer(folder)
        except (OSError, ValueError) as e:
            raise ModelError(f"{folder}: cannot load the tokenizer ({type(e).__name__}: {e})") from None
    return export_hf_folder(model.cfg, model.params, out_dir, tokenizer=tokenizer)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the export command."""
    p = argparse.ArgumentParser(prog="python -m jaxrl_mt.export",
                                description="Export a model spec to an HF-format folder.")
    p.add_argument("--model", required=True, help="builtin:NAME, a local HF folder or a hub id")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="parameter dtype")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command; returns the exit status (0, or 2 on a ModelError or an unwritable ``--out``)."""
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    try:
        if out.exists() and not out.is_dir():
            raise OSError(f"--out {out} is a file, not a folder")
        check_writable_dir(out.parent, "--out: folder")  # before the model is loaded
        out = export_model(args.model, out, dtype=args.dtype)
    except (ModelError, OSError) as e:  # an ExportError (a ModelError) keeps any previous folder at --out
        print(f"error: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
