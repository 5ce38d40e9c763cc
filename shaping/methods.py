"""Registry of named shaping methods, each one decorated function (advantage + loss terms).

A method is one function registered with `register`; its keyword defaults are the method's
hyper-parameters and defaults, its docstring gives the shapes, the source and the
hyper-parameters, and the decorator declares the batch keys it needs::

    @register("my_method", needs={"entropy"})
    def my_method(batch, *, beta: float = 0.1, std_correction: int = 1, eps: float = 1e-6):
        '''One line: the formula. ... Source: seed 00x Eq. y; docs/formulas.md §2.'''
        return Shaping(advantages=...)  # or just the (B, G) advantages

The registry then provides ``shaping.METHODS[name].loss(batch, **hyper) -> (scalar, metrics)``
(the clipped surrogate of `Shaping.advantages`, plus the common k3 KL and entropy terms and the
method's own terms, aggregated by ``loss_agg``) and ``.advantages(batch, **hyper) -> (B, G)`` to
both drivers (``toymdp/``, ``llm/``). The common loss hyper-parameters (`COMMON_DEFAULTS`) are
added to every method; a function may override one of their defaults by declaring it. Batch keys
and shapes: `shaping.contract`; formulas: docs/formulas.md §2 (one subsection per method).

Style follows verl's ``core_algos.register_adv_est`` / ``register_policy_loss`` (a name-keyed
registry filled by a decorator), with the method's defaults read from its signature.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import marshal
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np
from array_api_compat import array_namespace, device, is_jax_array, is_numpy_array, is_torch_array

from shaping import core
from shaping.backend import concretizes_a_tracer, stop_gradient, top_k
from shaping.contract import check_batch, check_values

Array = Any
Batch = Mapping[str, Array]

__all__ = [
    "COMMON_BOUNDS",
    "COMMON_DEFAULTS",
    "METHODS",
    "OFF_POLICY_ONLY",
    "SIZE_AXES",
    "Extra",
    "Method",
    "Shaping",
    "code_digest",
    "get_method",
    "import_methods",
    "imported_methods",
    "method_code",
    "methods_table",
    "register",
]

COMMON_DEFAULTS: Mapping[str, object] = MappingProxyType(
    {
        "eps_low": 0.2,
        "eps_high": 0.2,
        "loss_agg": "token-mean",
        "kl_coef": 0.0,
        "entropy_coef": 0.0,
        "kl_estimator": "k3",
        "top_entropy_quantile": 1.0,
    }
)
"""Hyper-parameters of every method's loss: clip widths of the clipped surrogate, the loss
aggregation (`core.AGG_MODES`), the KL coefficient (needs ``logp_ref``) and its per-token
estimator (`core.KL_ESTIMATORS`), verl's ``entropy_coeff`` (needs ``entropy``) and TRL's
``top_entropy_quantile`` (the "80/20" mask: the policy term only on the batch's highest-entropy
tokens; below 1 it needs ``entropy``)."""


@dataclass(frozen=True)
class Extra:
    """Loss terms a method adds to the clipped surrogate (computed only by ``Method.loss``).

    Attributes:
        token: (B, G, T) per-token term added before aggregation (0 on padding is not needed:
            padding is masked out by the aggregation).
        scalar: scalar added after aggregation.
        metrics: detached scalar metrics to report.
        token_metrics: (B, G, T) per-token quantities reported aggregated by ``loss_agg``.
    """

    token: Array | None = None
    scalar: Array | None = None
    metrics: Mapping[str, Array] = field(default_factory=dict)
    token_metrics: Mapping[str, Array] = field(default_factory=dict)


@dataclass(frozen=True)
class Shaping:
    """What a method function returns (a bare (B, G) array means ``Shaping(advantages=it)``).

    Attributes:
        advantages: (B, G) advantages (detached by the registry).
        rows: (B, G) bool, the responses that enter the loss (None = all). Others are dropped
            from every term and from the aggregation's denominators, as the authors' code drops
            them from the training batch (unlikeliness, PSR/NSR subset normalization).
        ratio: ``(rho, A) -> rho'`` reshaping the (B, G, T) importance ratio before clipping.
        extra: ``rho -> Extra`` with the method's own loss terms (given the unshaped ratio).
        surrogate: ``(rho, A) -> (B, G, T)`` per-token policy loss replacing the clipped
            surrogate ``-min(rho A, clip(rho) A)`` (given the reshaped ratio and the detached
            (B, G) advantages): CISPO, dual clip, Clip-Cov, KL-Cov, entropy-based advantages.
    """

    advantages: Array
    rows: Array | None = None
    ratio: Callable[[Array, Array], Array] | None = None
    extra: Callable[[Array], Extra] | None = None
    surrogate: Callable[[Array, Array], Array] | None = None


@dataclass(frozen=True)
class Method:
    """A named shaping method.

    Attributes:
        name: registry key.
        needs: batch keys required with the default hyper-parameters, beyond
            rewards/mask/logp/logp_old (see `needs_for` for other settings).
        defaults: every hyper-parameter and its default (read-only).
        source: where the formula comes from (the docstring's ``Source:`` paragraph).
        advantages: ``advantages(batch, **hyper) -> (B, G)`` detached advantages.
        loss: ``loss(batch, **hyper) -> (scalar loss, dict of detached metrics)``.
        doc: the formula as implemented, one line (the docstring's first line).
        needs_fn: ``needs_fn(filled hyper) -> frozenset`` when the needs depend on settings.
        function: the decorated function itself.
        bounds: ``{hyper-parameter: bound}`` checked on every call (``">= 0"``, ``"in (0, 1]"``):
            `COMMON_BOUNDS` and those given to `register`.
        sizes: ``{axis: hyper-parameter}``: the batch axes (``"G"``, the group; ``"N"``, the
            candidates) whose size must be at least that hyper-parameter's value (`min_sizes`).
        code: for a method defined outside the package (a user's ``--import``), the SHA-256 (16
            hex digits) of its code as it registered (`method_code`); None for the package's own.
    """

    name: str
    needs: frozenset[str]
    defaults: Mapping[str, object]
    source: str
    advantages: Callable[..., Array]
    loss: Callable[..., tuple[Array, dict[str, Array]]]
    doc: str = ""
    needs_fn: Callable[[Mapping[str, object]], frozenset[str]] | None = field(
        default=None, repr=False, compare=False
    )
    function: Callable[..., Any] | None = field(default=None, repr=False, compare=False)
    bounds: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    sizes: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    code: str | None = field(default=None, repr=False, compare=False)

    def min_sizes(self, **hyper: object) -> dict[str, int]:
        """The smallest size of each batch axis of `sizes` under these hyper-parameters (e.g.
        ``{"G": 4}`` for pass@k's ``k = 4``); a batch with fewer is refused by the method.

        Raises:
            ValueError: an unknown hyper-parameter name.
        """
        h = _fill(self.name, self.defaults, hyper)
        return {axis: int(h[key]) for axis, key in self.sizes.items() if _concrete(h[key])}

    def needs_for(self, **hyper: object) -> frozenset[str]:
        """Batch keys (beyond rewards/mask/logp/logp_old) needed with these hyper-parameters.

        Raises:
            ValueError: an unknown hyper-parameter name.
        """
        h = _fill(self.name, self.defaults, hyper)
        extra = self.needs_fn(h) if self.needs_fn is not None else self.needs
        if not (_concrete(h["kl_coef"]) and h["kl_coef"] == 0):
            extra = extra | {"logp_ref"}
        if not (_concrete(h["entropy_coef"]) and h["entropy_coef"] == 0):
            extra = extra | {"entropy"}
        if not (_concrete(h["top_entropy_quantile"]) and h["top_entropy_quantile"] == 1):
            extra = extra | {"entropy"}
        return frozenset(extra)


_REGISTRY: dict[str, Method] = {}
METHODS: Mapping[str, Method] = MappingProxyType(_REGISTRY)
"""Read-only view ``name -> Method`` of every registered method."""

Needs = Iterable[str] | Callable[[Mapping[str, object]], Iterable[str]]


def register(
    name: str | Method,
    *,
    needs: Needs = (),
    bounds: Mapping[str, str] | None = None,
    sizes: Mapping[str, str] | None = None,
) -> Any:
    """Register a method: ``@register("name", needs=..., bounds=..., sizes=...)`` over its function.

    The decorated function takes the batch and keyword-only hyper-parameters, each with a
    default, and returns `Shaping` or the (B, G) advantages. Its docstring must have a
    ``Source:`` paragraph (the `Method.source`). `COMMON_DEFAULTS` are added to its defaults
    (the function may override a common default by declaring it; it receives only what it
    declares). The function is returned unchanged. ``register(method)`` with a ready `Method`
    also works (the older form).

    Args:
        name: the registry key (or a `Method`).
        needs: batch keys needed beyond rewards/mask/logp/logp_old: a set, or a function of the
            filled hyper-parameters returning one (when they depend on settings).
        bounds: the bound of each numeric hyper-parameter of the function: ``">= 0"``,
            ``"> 0"`` or ``"in [a, b]"`` with any brackets (checked on every call; the common
            loss coefficients' are `COMMON_BOUNDS`).
        sizes: ``{axis: hyper-parameter}``, `SIZE_AXES` to parameters: a batch axis whose size
            must be at least the parameter's value (``{"G": "k"}``: k responses of a group).
            A smaller batch is refused by the method's own check; `Method.min_sizes` tells batch
            generators such as `shaping.strategies.method_batches`.

    Raises:
        ValueError: a method of that name is already registered, the function has a parameter
            without a default, no ``Source:`` in its docstring, a bound that is not one of
            its parameters or not in the accepted form, or a size of another axis or parameter.
    """
    if isinstance(name, Method):
        return _add(name)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        _add(_method(name, fn, needs, MappingProxyType(dict(bounds or {})),
                     MappingProxyType(dict(sizes or {}))))  # fmt: skip
        return fn

    return decorate


def _add(method: Method) -> Method:
    if method.name in _REGISTRY:
        raise ValueError(f"method {method.name!r} is already registered")
    code = None if method.function is None else code_digest([method.function], _PACKAGE)
    if code != method.code:  # a copy of another method: its code is its own
        method = replace(method, code=code)
    _REGISTRY[method.name] = method
    return method


_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def code_digest(
    functions: Iterable[Callable[..., Any]], package: str | os.PathLike[str]
) -> str | None:
    """SHA-256 (16 hex digits) of the code of `functions` defined outside the folder `package` (a
    user's ``--import``), read now (at registration: the code that runs): each one's module file
    (the helpers and constants beside it included), else its own source, else its compiled code
    (a function typed at a prompt); a file shared by several functions counts once, and one file's
    digest is its SHA-256. Paths are not part of it (the same file gives the same digest on any
    machine). None when every function is `package`'s own: the package's version stands for them.
    Used by `Method.code` and `llm.tasks.Task.code`."""
    root = os.path.join(os.path.abspath(package), "")
    blobs: dict[str, bytes] = {}
    for fn in functions:
        fn = inspect.unwrap(getattr(fn, "func", fn))  # a functools.partial: its function
        try:
            path = inspect.getsourcefile(fn)
        except TypeError:
            path = None
        if path is not None and os.path.abspath(path).startswith(root):
            continue
        try:
            with open(path, "rb") as f:  # type: ignore[arg-type]
                data = f.read()
        except (OSError, TypeError):
            try:
                data = inspect.getsource(fn).encode()
            except (OSError, TypeError):
                code = getattr(fn, "__code__", None)
                data = marshal.dumps(code) if code is not None else repr(fn).encode()
        blobs[hashlib.sha256(data).hexdigest()] = data
    if not blobs:
        return None
    if len(blobs) == 1:
        return next(iter(blobs))[:16]
    return hashlib.sha256("".join(sorted(blobs)).encode()).hexdigest()[:16]


def method_code(names: Iterable[str]) -> dict[str, str]:
    """``{name: digest}`` of the methods of `names` defined outside the package (`Method.code`:
    the SHA-256 of the module file that registered each, as it was then), sorted by name. What a
    cached result of a user's method is keyed by, besides its config: editing the method's file
    and running again trains again (the toy's sweep cache, `toymdp.sweep.cache_file`; an LLM run
    folder's marker, `llm.orchestrate.jobs`). Another file that module imports is not part of the
    digest: after editing one, run with ``--no-cache`` (toy) or into a fresh ``--out``.

    Raises:
        ValueError: an unknown method name.
    """
    codes = {name: get_method(name).code for name in sorted(set(names))}
    return {name: code for name, code in codes.items() if code is not None}


def get_method(name: str) -> Method:
    """Return the registered method `name`.

    Raises:
        ValueError: unknown name (the message lists the known names).
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known: {sorted(_REGISTRY)}") from None


_IMPORTED: list[str] = []


def _import_key(spec: str) -> str:
    """What makes two ``--import`` specs the same: a ``.py`` file's real path, else the name."""
    return os.path.realpath(spec) if spec.endswith(".py") else spec


def import_methods(specs: Iterable[str]) -> list[str]:
    """Import the user's modules that register methods (``--import``), so that a method defined
    outside the package is known by name; returns the names of the methods they registered.

    Each spec is a module name importable from the current folder (``mymethods``,
    ``lab.methods``) or a path to a ``.py`` file. A spec imported before (a file by any spelling of
    its path) is not imported again;
    `imported_methods` lists them for worker processes (`llm.orchestrate.executor`).

    Raises:
        ValueError: naming the spec: no such module or file, or any error while importing it
            (its message kept, and its type where it is not an import or value error: a syntax
            error in the user's module, say; the original is chained for a traceback). A module
            that fails leaves nothing behind: neither its half-run module nor the methods it
            registered before failing.
    """
    before = set(_REGISTRY)
    for spec in specs:
        if _import_key(spec) in {_import_key(s) for s in _IMPORTED}:  # a file by any spelling
            continue
        name, known = None, set(_REGISTRY)
        try:
            if spec.endswith(".py"):
                path = str(spec)
                name = "sharpening_user_" + re.sub(r"\W", "_", path.rsplit("/", 1)[-1][:-3])
                loader = importlib.util.spec_from_file_location(name, path)
                if loader is None or loader.loader is None:
                    raise FileNotFoundError(f"no such file {path!r}")
                module = importlib.util.module_from_spec(loader)
                sys.modules[name] = module
                loader.loader.exec_module(module)
            else:
                if "" not in sys.path and "." not in sys.path:
                    sys.path.insert(0, "")  # the current folder, as `python -m` has it
                importlib.import_module(spec)
        except Exception as err:  # the user's code: whatever it raises is named by its spec
            if name is not None:
                sys.modules.pop(name, None)
            for method in set(_REGISTRY) - known:  # what it registered before failing
                del _REGISTRY[method]
            plain = isinstance(err, ImportError | OSError | ValueError)
            raise ValueError(f"--import {spec}: " + (str(err) if plain else
                                                      f"{type(err).__name__}: {err}")) from err  # fmt: skip
        _IMPORTED.append(spec)
    return sorted(set(_REGISTRY) - before)


def imported_methods() -> list[str]:
    """The specs `import_methods` imported in this process, in order."""
    return list(_IMPORTED)


def methods_table() -> str:
    """Markdown table of the registry: ``name | source | needs | defaults`` (one row per method)."""
    rows = ["| name | source | needs | defaults |", "|---|---|---|---|"]
    for name in sorted(_REGISTRY):
        m = _REGISTRY[name]
        needs = ", ".join(f"`{k}`" for k in sorted(m.needs)) or "-"
        defaults = ", ".join(f"`{k}={v!r}`" for k, v in m.defaults.items())
        rows.append(f"| `{name}` | {m.source} | {needs} | {defaults} |")
    return "\n".join(rows)


def _docstring_parts(name: str, fn: Callable[..., Any]) -> tuple[str, str]:
    doc = inspect.cleandoc(fn.__doc__ or "")
    paragraphs = [p.strip() for p in doc.split("\n\n")]
    for p in paragraphs:
        if p.startswith("Source:"):
            source = " ".join(p[len("Source:") :].split())
            return paragraphs[0].splitlines()[0], source
    raise ValueError(f"method {name!r}: the docstring of {fn.__name__} needs a 'Source:' paragraph")


def _method(
    name: str,
    fn: Callable[..., Any],
    needs: Needs,
    bounds: Mapping[str, str] = MappingProxyType({}),
    sizes: Mapping[str, str] = MappingProxyType({}),
) -> Method:
    own: dict[str, object] = {}
    for p in list(inspect.signature(fn).parameters.values())[1:]:
        if p.kind is not inspect.Parameter.KEYWORD_ONLY or p.default is inspect.Parameter.empty:
            raise ValueError(
                f"method {name!r}: parameter {p.name!r} of {fn.__name__} must be keyword-only "
                "with a default (the method's default)"
            )
        own[p.name] = p.default
    defaults = MappingProxyType({**COMMON_DEFAULTS, **own})
    unknown = sorted(set(bounds) - set(own))
    if unknown:
        raise ValueError(f"method {name!r}: bounds for {unknown}, which are not its parameters")
    wrong = {a: k for a, k in sizes.items() if a not in SIZE_AXES or k not in own}
    if wrong:
        raise ValueError(f"method {name!r}: sizes {wrong}: each axis one of {SIZE_AXES}, each "
                         "value one of its parameters")  # fmt: skip
    all_bounds = MappingProxyType({**COMMON_BOUNDS, **bounds})
    for text in all_bounds.values():
        _bound_rule(text)  # a bad bound fails at registration, not at the first call
    doc, source = _docstring_parts(name, fn)
    needs_fn = needs if callable(needs) else None
    fixed = frozenset() if callable(needs) else frozenset(needs)

    def shaping_of(batch: Batch, hyper: Mapping[str, object]) -> tuple[dict, Shaping]:
        h = _fill(name, defaults, hyper)
        _validate(name, h, batch, all_bounds)
        check_batch(name, batch)
        check_values(name, batch)
        try:
            out = fn(batch, **{k: h[k] for k in own})
        except Exception as err:
            if not concretizes_a_tracer(err):
                raise
            raise ValueError(
                f"method {name!r}: {fn.__name__} turned a traced JAX array into a concrete value "
                f"({type(err).__name__}: NumPy, float() or an if on an array); write it with "
                "array_namespace(batch['rewards']) and shaping.core's functions, which run on "
                "every backend (docs/adding_a_method.md)"
            ) from err
        shaped = out if isinstance(out, Shaping) else Shaping(advantages=out)
        _check_output(name, fn, shaped, batch["rewards"])
        return h, shaped

    def advantages(batch: Batch, **hyper: object) -> Array:
        return stop_gradient(shaping_of(batch, hyper)[1].advantages)

    def loss(batch: Batch, **hyper: object) -> tuple[Array, dict[str, Array]]:
        h, shaped = shaping_of(batch, hyper)
        return _policy_loss(name, batch, shaped, h)

    advantages.__name__, loss.__name__ = f"{name}_advantages", f"{name}_loss"
    advantages.__doc__ = (
        f"Advantages (B, G), detached, of `{fn.__name__}`: {doc}\n\n"
        f"Hyper-parameters: {dict(defaults)}. Raises ValueError naming a bad hyper-parameter or "
        "batch key."
    )
    loss.__doc__ = (
        f"Loss (scalar, metrics) of `{fn.__name__}`: {doc}\n\n"
        f"Hyper-parameters: {dict(defaults)}. Raises ValueError naming a bad hyper-parameter or "
        "batch key."
    )
    return Method(
        name=name,
        needs=frozenset(needs_fn(defaults)) if needs_fn is not None else fixed,
        defaults=defaults,
        source=source,
        advantages=advantages,
        loss=loss,
        doc=doc,
        needs_fn=(lambda h: frozenset(needs_fn(h))) if needs_fn is not None else None,
        function=fn,
        bounds=all_bounds,
        sizes=sizes,
    )


def _kind(x: object) -> str:
    """The array library of `x` (JAX's concrete arrays and tracers alike), else its type's name."""
    for kind, test in (("JAX", is_jax_array), ("torch", is_torch_array), ("NumPy", is_numpy_array)):
        if test(x):
            return kind
    return type(x).__name__


def _check_output(name: str, fn: Callable[..., Any], shaped: Shaping, rewards: Array) -> None:
    """A method function's advantages and rows are (B, G), the rewards' shape (static under
    ``jit`` too): a (B, G, T) or (B,) array would broadcast silently in the loss. They are arrays
    of the rewards' kind (NumPy advantages of torch rewards would fail in the loss, naming
    neither the method nor the cause)."""
    bg = tuple(rewards.shape)
    for field_name in ("advantages", "rows"):
        x = getattr(shaped, field_name)
        if x is None and field_name == "rows":
            continue
        if _kind(x) != _kind(rewards):
            raise ValueError(
                f"method {name!r}: {fn.__name__} returned {field_name} as {_kind(x)} arrays for "
                f"{_kind(rewards)} rewards; write it with "
                "array_namespace(batch['rewards']) and shaping.core's functions, which run on "
                "every backend (docs/adding_a_method.md)"
            )
        got = getattr(x, "shape", None)
        if got is None or tuple(got) != bg:
            raise ValueError(
                f"method {name!r}: {fn.__name__} returned {field_name} of shape "
                f"{None if got is None else tuple(got)}; expected (B, G) = {bg}, the rewards' shape"
            )


# ---------------------------------------------------------------------------------------------
# Hyper-parameter validation. Values that are not concrete Python numbers (e.g. JAX tracers when
# a driver vmaps over settings) are not checked: checking them would need their value.


def _concrete(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


SIZE_AXES = ("G", "N")
"""The batch axes a method's `sizes` may bound: the group's responses and the candidates."""

COMMON_BOUNDS: Mapping[str, str] = MappingProxyType(
    {
        "eps_low": "in [0, 1]",
        "eps_high": ">= 0",
        "kl_coef": ">= 0",
        "entropy_coef": ">= 0",
        "top_entropy_quantile": "in (0, 1]",
    }
)
"""Bounds of `COMMON_DEFAULTS` (a method's own are declared at its `register`)."""
_BOUND = re.compile(r"(>=|>) (\S+)|in ([\[(])(\S+), (\S+)([\])])")


def _bound_rule(text: str) -> Callable[[Any], bool]:
    """The predicate of a bound written ``">= 0"``, ``"> 0"`` or ``"in [0, 1)"`` (any brackets).

    Raises:
        ValueError: any other text (a bad `register(..., bounds=...)`).
    """
    m = _BOUND.fullmatch(text)
    if m is None:
        raise ValueError(
            f"bounds: expected '>= a', '> a' or 'in [a, b]' (any brackets), got {text!r}"
        )
    if m.group(1):
        lo = float(m.group(2))
        return (lambda v: v >= lo) if m.group(1) == ">=" else (lambda v: v > lo)
    lo, hi = float(m.group(4)), float(m.group(5))
    left_closed, right_closed = m.group(3) == "[", m.group(6) == "]"
    return lambda v: (v >= lo if left_closed else v > lo) and (v <= hi if right_closed else v < hi)


_CHOICES: dict[str, tuple[object, ...]] = {
    "loss_agg": core.AGG_MODES,
    "std_correction": (0, 1),
    "logp_reduction": ("sum", "mean"),
    "form": ("trajectory", "token"),
    "confidence_ref": ("prompt", "group_mean"),
    "kl_estimator": core.KL_ESTIMATORS,
    "clip_cov_select": ("top", "random"),
}
_INTEGERS = ("top_n", "max_response_length")
_BOOLEANS = ("skip_uniform_groups", "subset_normalization")
_SEEDS = ("clip_cov_seed",)


def _fill(name: str, defaults: Mapping[str, object], hyper: Mapping[str, object]) -> dict:
    unknown = sorted(set(hyper) - set(defaults))
    if unknown:
        raise ValueError(f"{name}: unknown hyper-parameter(s) {unknown}; known: {sorted(defaults)}")
    return {**defaults, **hyper}


def _validate(name: str, h: Mapping[str, object], batch: Batch, bounds: Mapping[str, str]) -> None:
    for key, value in h.items():
        if key in _CHOICES:
            if isinstance(value, bool) or value not in _CHOICES[key]:
                raise ValueError(
                    f"{name}: {key} must be one of {list(_CHOICES[key])}, got {value!r}"
                )
            continue
        if key in _BOOLEANS:
            if not isinstance(value, bool):
                raise ValueError(f"{name}: {key} must be true or false, got {value!r}")
            continue
        if key in _INTEGERS:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: {key} must be an int >= 1, got {value!r}")
            continue
        if key in _SEEDS:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
                raise ValueError(f"{name}: {key} must be an integer in [0, 2^32), got {value!r}")
            continue
        if key == "k":
            if _concrete(value) and (value < 1 or value != int(value)):
                raise ValueError(f"{name}: k must be an integer >= 1, got {value!r}")
            continue
        bound = bounds.get(key)
        if bound is not None and _concrete(value) and not _bound_rule(bound)(value):
            raise ValueError(f"{name}: {key} must be {bound}, got {value!r}")
    if "max_response_length" in h and "mask" in batch:
        t = batch["mask"].shape[-1]
        if h["loss_agg"] == "seq-mean-token-sum-norm" and h["max_response_length"] < t:
            raise ValueError(
                f"{name}: max_response_length = {h['max_response_length']} is below the batch's "
                f"padded response length T = {t}; set it to the generation cap (max_new_tokens)"
            )


# ---------------------------------------------------------------------------------------------
# Batch access helpers (Python branching on shapes only, never on values).


def _get(name: str, batch: Batch, key: str) -> Array:
    if key not in batch:
        raise ValueError(f"{name}: batch is missing key {key!r} (needed with these settings)")
    return batch[key]


def _rewards(name: str, batch: Batch) -> Array:
    r = batch["rewards"]
    xp = array_namespace(r)
    if xp.isdtype(r.dtype, "real floating"):
        return r
    like = batch.get("logp", batch.get("logp_old"))
    if like is not None and xp.isdtype(like.dtype, "real floating"):
        return xp.astype(r, like.dtype)
    return xp.astype(r, xp.__array_namespace_info__().default_dtypes()["real floating"])


def _correct_f(r: Array) -> Array:
    xp = array_namespace(r)
    return xp.astype(core.is_correct(r), r.dtype)


def _seq_logp_old(name: str, batch: Batch, reduction: str) -> Array:
    return core.sequence_logp(
        _get(name, batch, "logp_old"), _get(name, batch, "mask"), reduction=reduction
    )


def _masked_entropy(name: str, batch: Batch) -> Array:
    entropy, mask = _get(name, batch, "entropy"), _get(name, batch, "mask")
    xp = array_namespace(entropy, mask)
    keep = core._bool_mask(xp, mask)
    return xp.where(keep, entropy, xp.zeros_like(entropy))


def _mean(xp: Any, x: Array) -> Array:
    # The mean of an empty array (B = 0) is 0 here, not NaN.
    return xp.sum(x) / max(math.prod(x.shape), 1)


# ---------------------------------------------------------------------------------------------
# The loss every method shares: clipped surrogate + optional k3 KL + optional entropy bonus +
# the method's own terms, one aggregation.


def _policy_loss(
    name: str, batch: Batch, shaped: Shaping, h: Mapping[str, Any]
) -> tuple[Array, dict[str, Array]]:
    logp, logp_old, mask = (_get(name, batch, k) for k in ("logp", "logp_old", "mask"))
    xp = array_namespace(logp, mask)
    keep = core._bool_mask(xp, mask)
    if shaped.rows is not None:
        keep = keep & xp.expand_dims(shaped.rows, axis=-1)
    agg = h["loss_agg"]
    norm = h.get("max_response_length") if agg == "seq-mean-token-sum-norm" else None

    def aggregate(x: Array) -> Array:
        return core.agg_loss(x, keep, agg, norm_length=norm)

    adv = stop_gradient(shaped.advantages)
    ratio = core.importance_ratio(logp, logp_old, keep)
    extra = shaped.extra(ratio) if shaped.extra is not None else Extra()
    if shaped.ratio is not None:
        ratio = shaped.ratio(ratio, adv)
    clipped = core.clipped_surrogate(ratio, adv, eps_low=h["eps_low"], eps_high=h["eps_high"])
    # The fraction of tokens past the trust region on the binding side (PPO's pg_clipfrac), for a
    # method's own surrogate too: read from the clipped surrogate of the same ratio.
    clip_frac = core._clip_fraction(xp, stop_gradient(clipped), stop_gradient(ratio), adv, keep)
    surrogate = clipped if shaped.surrogate is None else shaped.surrogate(ratio, adv)
    top = h["top_entropy_quantile"]
    high = None
    if not (_concrete(top) and top == 1):
        # "80/20": the policy term only on the batch's highest-entropy tokens; the denominators
        # (and the KL term) still count every token, as TRL's GRPOTrainer.
        high = core.batch_high_entropy_mask(_get(name, batch, "entropy"), keep, top=top)
        surrogate = xp.where(high, surrogate, xp.zeros_like(surrogate))
    if "is_weight" in batch:
        # Rollout importance weight (sampler -> behaviour policy), on the surrogate only, before
        # the KL and extra terms, as TRL's vllm_importance_sampling_correction and verl's TIS do.
        surrogate = surrogate * stop_gradient(batch["is_weight"])
    per_token = surrogate
    out: dict[str, Array] = {}
    kl_coef = h["kl_coef"]
    if not (_concrete(kl_coef) and kl_coef == 0):
        kl = core.kl_penalty(logp, _get(name, batch, "logp_ref"), keep, h["kl_estimator"])
        per_token = per_token + kl_coef * kl
        out["kl"] = aggregate(stop_gradient(kl))
    entropy_coef = h["entropy_coef"]
    bonus = None
    if not (_concrete(entropy_coef) and entropy_coef == 0):
        if high is None:
            # verl's actor.entropy_coeff: loss -= c * agg(token entropy), the same aggregation.
            per_token = per_token - entropy_coef * _masked_entropy(name, batch)
        else:
            # Under the 80/20 mask, TRL's: the bonus on the kept tokens only, aggregated over them
            # (their own denominators; docs/formulas.md §2.23).
            h_kept = xp.where(high, _get(name, batch, "entropy"), 0.0)
            bonus = -entropy_coef * core.agg_loss(h_kept, high, agg, norm_length=norm)
    if extra.token is not None:
        per_token = per_token + extra.token
    loss = aggregate(per_token)
    if bonus is not None:
        loss = loss + bonus
    if extra.scalar is not None:
        loss = loss + extra.scalar
    # Metrics are computed on detached values so they add no autograd work.
    surrogate = stop_gradient(surrogate)
    alone = per_token is surrogate and bonus is None
    out["pg_loss"] = stop_gradient(loss) if alone else aggregate(surrogate)
    out["clip_frac"] = clip_frac
    out["adv_mean"] = _mean(xp, adv)
    out.update({k: aggregate(stop_gradient(v)) for k, v in extra.token_metrics.items()})
    out.update(extra.metrics)
    return loss, {k: stop_gradient(v) for k, v in out.items()}


# =============================================================================================
# Methods. Each docstring: the formula (first line), shapes, hyper-parameters, source.
# Shapes: batch keys as in `shaping.contract.BATCH_KEYS`; every function returns (B, G)
# advantages or a `Shaping` around them.


def _grpo_of(r: Array, std_correction: int, eps: float) -> Array:
    return core.grpo_advantages(r, std_correction=std_correction, eps=eps)


@register("grpo", bounds={"eps": ">= 0"})
def grpo(batch: Batch, *, std_correction: int = 1, eps: float = 1e-6) -> Array:
    """GRPO: ``A = (r - mean_G r) / (std_G r + eps)``, clipped surrogate, optional k3 KL.

    Shapes: ``rewards`` (B, G) -> advantages (B, G); the loss reads ``logp``, ``logp_old``,
    ``mask`` (B, G, T).

    Hyper-parameters: ``std_correction`` 1 = unbiased group std (TRL, verl), 0 = population;
    ``eps`` added to the std. A constant group (or G = 1) gets advantage 0.

    Source: Shao et al. 2024 (DeepSeekMath); docs/formulas.md §2.1
    """
    return _grpo_of(_rewards("grpo", batch), std_correction, eps)


@register("dr_grpo")
def dr_grpo(
    batch: Batch,
    *,
    loss_agg: str = "seq-mean-token-sum-norm",
    max_response_length: int = 256,
) -> Array:
    """Dr. GRPO: ``A = r - mean_G r``; loss = mean over sequences of token sums / L (a constant).

    Shapes: ``rewards`` (B, G) -> advantages (B, G).

    Hyper-parameters: ``loss_agg`` (default ``"seq-mean-token-sum-norm"``, the unbiased
    aggregation); ``max_response_length`` = ``L``, the constant divisor of that aggregation:
    the generation cap (``max_new_tokens``, as TRL's ``max_completion_length``), not the batch's
    longest response. Default 256 (TRL's ``GRPOConfig.max_completion_length`` default); drivers
    should pass their cap. It must be an int >= the padded length T of every batch (ValueError
    naming ``max_response_length`` otherwise). Ignored by the other aggregations.

    Source: Liu et al. 2025 (Dr. GRPO), TRL loss_type="dr_grpo"; docs/formulas.md §2.2, §2.5
    """
    return core.dr_grpo_advantages(_rewards("dr_grpo", batch))


def _ds(name: str, batch: Batch, gamma_p: Any, gamma_n: Any, h: Mapping[str, Any]) -> Array:
    r = _rewards(name, batch)
    ell = _seq_logp_old(name, batch, h["logp_reduction"])
    c = _correct_f(r)
    a = _grpo_of(r, h["std_correction"], h["eps"])
    return a - gamma_p * c * ell + gamma_n * (1.0 - c) * ell


@register("ds_grpo", bounds={"eps": ">= 0", "gamma_p": ">= 0", "gamma_n": ">= 0"})
def ds_grpo(
    batch: Batch,
    *,
    std_correction: int = 1,
    eps: float = 1e-6,
    gamma_p: float = 0.02,
    gamma_n: float = 0.005,
    logp_reduction: str = "sum",
) -> Array:
    """DS-GRPO: ``A~ = A - gamma_p l`` on correct, ``A + gamma_n l`` on incorrect responses.

    ``A`` is GRPO's advantage and ``l = log pi_old(tau)`` the sequence log-prob.

    Shapes: ``rewards`` (B, G), ``logp_old``, ``mask`` (B, G, T) -> advantages (B, G).

    Hyper-parameters: ``gamma_p``, ``gamma_n`` >= 0; ``logp_reduction`` "sum" (``log pi(tau)``,
    the theory's quantity) or "mean" (length-normalized); ``std_correction``, ``eps`` as GRPO.

    Source: seed 000 §4.2 (Eq. 4, differential smoothing); docs/formulas.md §2.9
    """
    h = {"std_correction": std_correction, "eps": eps, "logp_reduction": logp_reduction}
    return _ds("ds_grpo", batch, gamma_p, gamma_n, h)


@register("ds_grpo_pos", bounds={"eps": ">= 0", "gamma_p": ">= 0"})
def ds_grpo_pos(
    batch: Batch,
    *,
    std_correction: int = 1,
    eps: float = 1e-6,
    gamma_p: float = 0.02,
    logp_reduction: str = "sum",
) -> Array:
    """DS-Positive: ``A~ = A - gamma_p l`` on correct responses only (``gamma_n = 0``).

    Shapes: ``rewards`` (B, G), ``logp_old``, ``mask`` (B, G, T) -> advantages (B, G).

    Hyper-parameters: ``gamma_p`` >= 0; ``logp_reduction`` "sum" or "mean";
    ``std_correction``, ``eps`` as GRPO.

    Source: seed 000 §4.2 (DS-Positive ablation); docs/formulas.md §2.9
    """
    h = {"std_correction": std_correction, "eps": eps, "logp_reduction": logp_reduction}
    return _ds("ds_grpo_pos", batch, gamma_p, 0.0, h)


@register("ds_grpo_neg", bounds={"eps": ">= 0", "gamma_n": ">= 0"})
def ds_grpo_neg(
    batch: Batch,
    *,
    std_correction: int = 1,
    eps: float = 1e-6,
    gamma_n: float = 0.005,
    logp_reduction: str = "sum",
) -> Array:
    """DS-Negative: ``A~ = A + gamma_n l`` on incorrect responses only (``gamma_p = 0``).

    Shapes: ``rewards`` (B, G), ``logp_old``, ``mask`` (B, G, T) -> advantages (B, G).

    Hyper-parameters: ``gamma_n`` >= 0; ``logp_reduction`` "sum" or "mean";
    ``std_correction``, ``eps`` as GRPO.

    Source: seed 000 §4.2 (DS-Negative ablation); docs/formulas.md §2.9
    """
    h = {"std_correction": std_correction, "eps": eps, "logp_reduction": logp_reduction}
    return _ds("ds_grpo_neg", batch, 0.0, gamma_n, h)


def _entropy_shaping(
    name: str, sign: float, batch: Batch, eta: Any, form: str, h: Mapping[str, Any]
) -> Shaping:
    # sign = +1 for the bonus (reward - eta log pi), -1 for the penalty (reward + eta log pi).
    a = _grpo_of(_rewards(name, batch), h["std_correction"], h["eps"])
    if form == "trajectory":
        return Shaping(a - sign * eta * _seq_logp_old(name, batch, h["logp_reduction"]))
    entropy = _masked_entropy(name, batch)
    return Shaping(
        a, extra=lambda _: Extra(token=-sign * eta * entropy, token_metrics={"entropy": entropy})
    )


def _entropy_needs(h: Mapping[str, object]) -> frozenset[str]:
    return frozenset({"entropy"}) if h["form"] == "token" else frozenset()


@register("entropy_bonus", needs=_entropy_needs, bounds={"eps": ">= 0", "eta": ">= 0"})
def entropy_bonus(
    batch: Batch,
    *,
    std_correction: int = 1,
    eps: float = 1e-6,
    eta: float = 0.01,
    form: str = "trajectory",
    logp_reduction: str = "sum",
) -> Shaping:
    """Global entropy bonus: trajectory ``A~ = A - eta l``; token: ``loss -= eta agg(H_t)``.

    Shapes: ``rewards`` (B, G), ``logp_old``, ``mask`` (B, G, T); form="token" also reads
    ``entropy`` (B, G, T) -> advantages (B, G).

    Hyper-parameters: ``eta`` >= 0; ``form`` "trajectory" (reward shaping by the sequence
    log-prob ``l``, Lemma B.4) or "token" (per-token entropy term, verl's ``entropy_coeff``);
    ``logp_reduction``, ``std_correction``, ``eps`` as `ds_grpo`.

    Source: seed 000 Lemma B.4 (global entropy bonus); token form: verl entropy_coeff; docs/formulas.md §2.10
    """
    h = {"std_correction": std_correction, "eps": eps, "logp_reduction": logp_reduction}
    return _entropy_shaping("entropy_bonus", +1.0, batch, eta, form, h)


@register("entropy_penalty", needs=_entropy_needs, bounds={"eps": ">= 0", "eta": ">= 0"})
def entropy_penalty(
    batch: Batch,
    *,
    std_correction: int = 1,
    eps: float = 1e-6,
    eta: float = 0.01,
    form: str = "trajectory",
    logp_reduction: str = "sum",
) -> Shaping:
    """Global entropy penalty: trajectory ``A~ = A + eta l``; token: ``loss += eta agg(H_t)``.

    Shapes: ``rewards`` (B, G), ``logp_old``, ``mask`` (B, G, T); form="token" also reads
    ``entropy`` (B, G, T) -> advantages (B, G).

    Hyper-parameters: ``eta`` >= 0, the penalty's strength; ``form`` "trajectory" or "token";
    ``logp_reduction``, ``std_correction``, ``eps`` as `entropy_bonus`.

    Source: seed 000 Lemma B.4 (global entropy penalty); token form: verl entropy_coeff; docs/formulas.md §2.10
    """
    h = {"std_correction": std_correction, "eps": eps, "logp_reduction": logp_reduction}
    return _entropy_shaping("entropy_penalty", -1.0, batch, eta, form, h)


@register(
    "diff_entropy", needs={"entropy"}, bounds={"eps": ">= 0", "eta_pos": ">= 0", "eta_neg": ">= 0"}
)
def diff_entropy(
    batch: Batch,
    *,
    std_correction: int = 1,
    eps: float = 1e-6,
    eta_pos: float = 0.01,
    eta_neg: float = 0.01,
) -> Shaping:
    """Differential entropy control: GRPO ``A``; ``loss += -eta_pos H_t`` (correct), ``+eta_neg H_t``.

    Shapes: ``rewards`` (B, G), ``entropy``, ``mask`` (B, G, T) -> advantages (B, G).

    Hyper-parameters: ``eta_pos`` (entropy bonus on correct responses), ``eta_neg`` (penalty on
    incorrect ones), both >= 0; ``std_correction``, ``eps`` as GRPO.

    Source: seed 000 §4.8.2 (differential entropy control); docs/formulas.md §2.11
    """
    r = _rewards("diff_entropy", batch)

    def extra(_: Array) -> Extra:
        entropy = _masked_entropy("diff_entropy", batch)
        xp = array_namespace(entropy)
        c = _correct_f(r)
        coef = xp.expand_dims(eta_pos * c - eta_neg * (1.0 - c), axis=-1)
        return Extra(token=-coef * entropy, token_metrics={"entropy": entropy})

    return Shaping(_grpo_of(r, std_correction, eps), extra=extra)


def _dsdr_weights(s: Array, correct: Array, tau: Any) -> Array:
    # Softmax over the correct set only; shifting by the max over that set keeps exp finite.
    xp = array_namespace(s, correct)
    z = s / tau
    floor = xp.min(z, axis=-1, keepdims=True)
    top = xp.max(xp.where(correct, z, floor), axis=-1, keepdims=True)
    e = xp.where(correct, xp.exp(xp.where(correct, z - top, xp.zeros_like(z))), xp.zeros_like(z))
    total = xp.sum(e, axis=-1, keepdims=True)
    return core._safe_divide(xp, e, total)


@register(
    "dsdr",
    needs={"diversity"},
    bounds={"eps": ">= 0", "lam": ">= 0", "sigma": ">= 0", "tau": "> 0", "lam_loc": ">= 0"},
)
def dsdr(
    batch: Batch,
    *,
    std_correction: int = 1,
    eps: float = 1e-6,
    lam: float = 0.1,
    sigma: float = 0.5,
    tau: float = 1.0,
    lam_loc: float = 0.01,
) -> Shaping:
    """DSDR: GRPO ``A`` of ``r~ = r + lam 1[correct] min(s, sigma)``, minus ``lam_loc`` L_loc.

    ``L_loc = mean_B sum_{i in C} w_i mean_t[rho_t (-log pi_t)]`` with
    ``w = softmax_C(s / tau)`` over the correct set (0 elsewhere; all 0 without a correct
    response), ``rho`` the unclipped importance ratio. ``rho (-log pi)`` is read as its limit 0
    where ``log pi = -inf`` (then ``rho = 0``), so value and gradient stay finite. With B = 0
    the loss is 0.

    Shapes: ``rewards``, ``diversity`` (B, G); ``logp``, ``logp_old``, ``mask`` (B, G, T)
    -> advantages (B, G); metric ``local_entropy`` = L_loc.

    Hyper-parameters: ``lam`` >= 0 (reward bonus), ``sigma`` >= 0 (cap on s_i), ``tau`` > 0
    (softmax temperature), ``lam_loc`` >= 0 (local-term weight); ``std_correction``, ``eps``.

    Source: seed 001 Eqs. 10, 11, 15, 16 (DSDR); docs/formulas.md §2.16-§2.17
    """
    r = _rewards("dsdr", batch)
    xp = array_namespace(r)
    s = _get("dsdr", batch, "diversity")
    shaped_r = r + lam * _correct_f(r) * xp.clip(s, max=sigma)

    def extra(ratio: Array) -> Extra:
        logp, mask = batch["logp"], batch["mask"]
        keep = core._bool_mask(xp, mask)
        w = stop_gradient(_dsdr_weights(s, core.is_correct(r), tau))
        # Double where: a -inf log-prob (ratio 0) must give 0, not 0 * inf, in value and gradient.
        finite = keep & (logp > -math.inf)
        lp = xp.where(finite, logp, 0.0)
        count = xp.sum(xp.astype(keep, logp.dtype), axis=-1)
        local = -xp.sum(xp.where(finite, ratio * lp, 0.0), axis=-1) / xp.maximum(count, 1.0)
        l_loc = xp.sum(xp.sum(w * local, axis=-1)) / max(r.shape[0], 1)
        return Extra(scalar=-lam_loc * l_loc, metrics={"local_entropy": stop_gradient(l_loc)})

    return Shaping(_grpo_of(shaped_r, std_correction, eps), extra=extra)


def _progrpo_needs(h: Mapping[str, object]) -> frozenset[str]:
    return (
        frozenset({"prompt_logp", "prompt_mask"})
        if h["confidence_ref"] == "prompt"
        else frozenset()
    )


@register(
    "progrpo",
    needs=_progrpo_needs,
    bounds={"eps": ">= 0", "alpha": ">= 0", "low_frac": "in (0, 1]"},
)
def progrpo(
    batch: Batch,
    *,
    std_correction: int = 1,
    eps: float = 1e-6,
    alpha: float = 0.3,
    low_frac: float = 0.2,
    confidence_ref: str = "prompt",
) -> Array:
    """ProGRPO: ``A~ = A + alpha (c(q) - c(o_i|q))`` in mixed groups; ``c = exp(mean low log p)``.

    ``c`` averages the log-probs of the ``low_frac`` lowest-probability tokens (at least one);
    groups whose rewards are all equal keep GRPO's ``A``.

    Shapes: ``rewards`` (B, G), ``logp_old``, ``mask`` (B, G, T); confidence_ref="prompt" also
    reads ``prompt_logp``, ``prompt_mask`` (B, P) -> advantages (B, G).

    Hyper-parameters: ``alpha`` >= 0; ``low_frac`` in (0, 1]; ``confidence_ref`` "prompt"
    (``c(q)`` of the prompt, Alg. 1) or "group_mean" (Eq. 10: the group's mean ``c``);
    ``std_correction``, ``eps`` as GRPO.

    Source: seed 003 Alg. 1, Eqs. 4-6 (Eq. 10 for confidence_ref='group_mean'); docs/formulas.md §2.15
    """
    r = _rewards("progrpo", batch)
    xp = array_namespace(r)
    a = _grpo_of(r, std_correction, eps)
    conf = core.low_prob_confidence(
        _get("progrpo", batch, "logp_old"), _get("progrpo", batch, "mask"), low_frac=low_frac
    )
    if confidence_ref == "prompt":
        ref = core.low_prob_confidence(
            _get("progrpo", batch, "prompt_logp"),
            _get("progrpo", batch, "prompt_mask"),
            low_frac=low_frac,
        )
        ref = xp.expand_dims(ref, axis=-1)
    else:
        ref = xp.mean(conf, axis=-1, keepdims=True)
    mixed = xp.max(r, axis=-1, keepdims=True) > xp.min(r, axis=-1, keepdims=True)
    return a + xp.where(mixed, alpha * (ref - conf), xp.zeros_like(a))


@register(
    "casp",
    needs={"entropy", "sampled_rank", "cand_logp"},
    bounds={"eps": ">= 0", "alpha": "in [0, 1]", "quantile": "in (0, 1)", "lam_top1": "> 0"},
    sizes={"N": "top_n"},
)
def casp(
    batch: Batch,
    *,
    std_correction: int = 1,
    eps: float = 1e-6,
    alpha: float = 0.01,
    top_n: int = 3,
    quantile: float = 0.8,
    lam_top1: float = 1.1,
) -> Shaping:
    """CaSP: on tokens with ``H_t`` above its q-quantile, top-N smoothing (A > 0), rank-1 penalty (A < 0).

    ``rho+ = (1 - alpha) rho + (alpha / top_n) sum_n sg(rho / rho_n) rho_n`` where ``A > 0``;
    ``rho- = lam_top1 rho`` where ``A < 0`` and the sampled token is pi_old's rank 1
    (`core.casp_ratio`). GRPO advantages.

    Shapes: ``rewards`` (B, G); ``entropy``, ``sampled_rank``, ``mask`` (B, G, T);
    ``cand_logp`` (B, G, T, N) with ``N >= top_n`` -> advantages (B, G). T = 0 gives loss 0.

    Hyper-parameters: ``alpha`` in [0, 1]; ``top_n`` int in [1, N]; ``quantile`` in (0, 1);
    ``lam_top1`` > 0; ``std_correction``, ``eps``.

    Source: seed 004 Eqs. 4.1, 5; authors' code compute_policy_loss_simko; docs/formulas.md §2.18-§2.20
    """
    name = "casp"
    entropy, cand, rank, mask = (
        _get(name, batch, k) for k in ("entropy", "cand_logp", "sampled_rank", "mask")
    )

    def ratio(rho: Array, adv: Array) -> Array:
        return core.casp_ratio(
            rho, adv, entropy, cand, rank, mask,
            alpha=alpha, top_n=top_n, quantile=quantile, lam_top1=lam_top1,
        )  # fmt: skip

    return Shaping(_grpo_of(_rewards(name, batch), std_correction, eps), ratio=ratio)


def _mixed(r: Array) -> Array:
    # (B, G) bool: the response's group has both a correct and an incorrect response.
    xp = array_namespace(r)
    c = core.is_correct(r)
    mixed = xp.any(c, axis=-1, keepdims=True) & xp.any(~c, axis=-1, keepdims=True)
    return xp.broadcast_to(mixed, r.shape)


@register("unlikeliness", bounds={"eps": ">= 0", "beta_rank": ">= 0"})
def unlikeliness(
    batch: Batch,
    *,
    std_correction: int = 1,
    eps: float = 1e-6,
    beta_rank: float = 0.25,
    skip_uniform_groups: bool = True,
) -> Shaping:
    """Unlikeliness reward: ``r <- r (1 - beta_rank rank_i / G)``, then GRPO.

    ``rank_i`` is the ascending rank (0 = least likely) of the length-normalized
    ``log pi_old`` within the group (`core.group_rank`).

    Shapes: ``rewards`` (B, G), ``logp_old``, ``mask`` (B, G, T) -> advantages (B, G).

    Hyper-parameters: ``beta_rank`` >= 0; ``skip_uniform_groups`` (default True, as the
    authors' runs: ``lean.advantage_threshold=True`` in ``examples/lean/grpo.sh``): groups with
    no mixed outcome (all correct or all wrong) are dropped from the loss, their advantages 0;
    False keeps them (their rank-shaped rewards then still differ); ``std_correction``, ``eps``.

    Source: He, Fried, Welleck 2025 (authors' code, ray_lean_trainer.py); docs/formulas.md §2.12
    """
    r = _rewards("unlikeliness", batch)
    xp = array_namespace(r)
    rank = core.group_rank(_seq_logp_old("unlikeliness", batch, "mean"))
    a = _grpo_of(r * (1.0 - beta_rank * rank / r.shape[-1]), std_correction, eps)
    if not skip_uniform_groups:
        return Shaping(a)
    mixed = _mixed(r)
    return Shaping(xp.where(mixed, a, xp.zeros_like(a)), rows=mixed)


@register("passk", sizes={"G": "k"})
def passk(batch: Batch, *, k: int = 4) -> Array:
    """Pass@k training: ``A_pos = (1-R)/sigma``, ``A_neg = (1-R-C(N_neg-1,k-1)/C(N-1,k-1))/sigma``.

    ``R = 1 - C(N_neg, k)/C(N, k)`` is the group's pass@k, ``sigma = sqrt(R(1-R))``; a group
    where every k-subset has the same reward gets 0 (`core.passk_advantages`).

    Shapes: ``rewards`` (B, G) -> advantages (B, G).

    Hyper-parameters: ``k`` integer in [1, G].

    Source: Chen et al. 2025, Pass@k Training (authors' code); docs/formulas.md §2.14
    """
    return core.passk_advantages(_rewards("passk", batch), k=k)


@register("w_reinforce", bounds={"lam": ">= 0"})
def w_reinforce(batch: Batch, *, lam: float = 0.1) -> Array:
    """W-REINFORCE: ``A = +lam`` on correct, ``-1`` on incorrect responses; no normalization.

    Shapes: ``rewards`` (B, G) -> advantages (B, G).

    Hyper-parameters: ``lam`` >= 0 (the authors' ``positive_advantage_weight``).

    Source: Zhu et al. 2025, W-REINFORCE (authors' code); docs/formulas.md §2.13
    """
    c = _correct_f(_rewards("w_reinforce", batch))
    return lam * c - (1.0 - c)


def _signed(name: str, batch: Batch, correct_side: bool, subset: bool) -> Shaping:
    r = _rewards(name, batch)
    c = _correct_f(r)
    adv = c if correct_side else c - 1.0
    if not subset:
        return Shaping(adv)
    keep = core.is_correct(r)
    return Shaping(adv, rows=keep if correct_side else ~keep)


@register("psr")
def psr(batch: Batch, *, subset_normalization: bool = False) -> Shaping:
    """PSR: ``A = +1`` on correct, 0 on incorrect responses (positive samples only).

    Shapes: ``rewards`` (B, G) -> advantages (B, G).

    Hyper-parameters: ``subset_normalization`` (default False: incorrect responses stay in
    the aggregation's denominators with A = 0); True drops them from the loss, as the authors'
    trainer keeps only the correct subset of the batch (``batch.subset``), so ``token-mean``
    averages over the correct responses' tokens only.

    Source: Zhu et al. 2025, PSR (authors' code, ray_trainer.py); docs/formulas.md §2.13
    """
    return _signed("psr", batch, True, subset_normalization)


@register("nsr")
def nsr(batch: Batch, *, subset_normalization: bool = False) -> Shaping:
    """NSR: ``A = -1`` on incorrect, 0 on correct responses (negative samples only).

    Shapes: ``rewards`` (B, G) -> advantages (B, G).

    Hyper-parameters: ``subset_normalization`` (default False); True drops the correct
    responses from the loss, as the authors' trainer keeps only the incorrect subset.

    Source: Zhu et al. 2025, NSR (authors' code, ray_trainer.py); docs/formulas.md §2.13
    """
    return _signed("nsr", batch, False, subset_normalization)


OFF_POLICY_ONLY: frozenset[str] = frozenset({"dual_clip", "gspo", "cispo", "kl_cov"})
"""Methods whose gradient is GRPO's when every ratio is 1, i.e. in a strictly on-policy run (one
optimizer step per rollout batch); GSPO with its own aggregation ``seq-mean-token-mean``. They
differ from GRPO only with several steps per batch (a test checks the equality)."""


# ---------------------------------------------------------------------------------------------
# Policy losses the field uses beside GRPO's clipped surrogate: each keeps GRPO's group advantages
# and changes the per-token loss (`Shaping.surrogate`) or the ratio. A method that reads the clip
# widths declares ``eps_low`` / ``eps_high`` (the common defaults).


def _expanded(xp: Any, adv: Array, like: Array) -> Array:
    # (B, G) advantages broadcast to (B, G, T).
    return xp.expand_dims(adv, axis=-1) * xp.ones_like(like)


@register("dual_clip", bounds={"eps": ">= 0", "clip_ratio_c": "> 1"})
def dual_clip(
    batch: Batch,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    std_correction: int = 1,
    eps: float = 1e-6,
    clip_ratio_c: float = 3.0,
) -> Shaping:
    """Dual-clip PPO: where ``A < 0`` the clipped surrogate is capped at ``-c A`` (GRPO advantages).

    ``l_t = -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A)``, then ``min(l_t, -c A)`` where
    ``A < 0``: a negative-advantage token whose ratio has grown past ``c`` stops pushing (zero
    gradient). Acts only off-policy (ratio != 1).

    Shapes: ``rewards`` (B, G); ``logp``, ``logp_old``, ``mask`` (B, G, T) -> advantages (B, G).

    Hyper-parameters: ``clip_ratio_c`` > 1 (verl's default 3.0); ``std_correction``, ``eps``.

    Source: Ye et al. 2019, arXiv 1912.09729 (dual clip); verl ``compute_policy_loss_vanilla``
    (``clip_ratio_c``); docs/formulas.md §2.24
    """

    def surrogate(rho: Array, adv: Array) -> Array:
        xp = array_namespace(rho, adv)
        loss = core.clipped_surrogate(rho, adv, eps_low=eps_low, eps_high=eps_high)
        a = _expanded(xp, adv, rho)
        return xp.where(a < 0, xp.minimum(loss, -clip_ratio_c * a), loss)

    return Shaping(_grpo_of(_rewards("dual_clip", batch), std_correction, eps), surrogate=surrogate)


@register("gspo", bounds={"eps": ">= 0"})
def gspo(
    batch: Batch,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    loss_agg: str = "seq-mean-token-mean",
    std_correction: int = 1,
    eps: float = 1e-6,
) -> Shaping:
    """GSPO: the clipped surrogate of the sequence ratio ``s_i = exp(mean_t log rho_t)`` (GRPO advantages).

    Token form ``s_it = sg(s_i) pi_t / sg(pi_t)``: its value is ``s_i`` and its gradient
    ``s_i grad log pi_t``, so every token of a response shares one ratio and one clip decision.
    With equal token ratios within each response it is GRPO's loss (same widths).

    Shapes: ``rewards`` (B, G); ``logp``, ``logp_old``, ``mask`` (B, G, T) -> advantages (B, G).

    Hyper-parameters: ``eps_low`` 3e-4 and ``eps_high`` 4e-4 (the paper's widths, far narrower
    than a token ratio's), ``loss_agg`` "seq-mean-token-mean" (the paper's and verl's);
    ``std_correction``, ``eps``.

    Source: Zheng et al. 2025, arXiv 2507.18071 (GSPO, Eqs. 5-7 and the token form GSPO-token);
    verl ``compute_policy_loss_gspo``; TRL ``importance_sampling_level="sequence"``;
    docs/formulas.md §2.26
    """
    name = "gspo"
    logp, logp_old, mask = (_get(name, batch, k) for k in ("logp", "logp_old", "mask"))

    def ratio(rho: Array, adv: Array) -> Array:
        xp = array_namespace(rho, logp)
        keep = core._bool_mask(xp, mask)
        lp = xp.where(keep, logp, 0.0)
        seq = core.masked_mean(lp - xp.where(keep, logp_old, 0.0), keep, keepdims=True)
        # The straight-through part is 0 in value; a -inf log-prob (s_i = 0) gives it 0 too.
        lp = xp.where(lp > -math.inf, lp, 0.0)
        log_s = lp - stop_gradient(lp) + stop_gradient(seq)
        return xp.exp(xp.clip(log_s, max=core.LOG_RATIO_MAX))

    return Shaping(_grpo_of(_rewards(name, batch), std_correction, eps), ratio=ratio)


@register("cispo", bounds={"eps": ">= 0"})
def cispo(
    batch: Batch,
    *,
    eps_low: float = 1.0,
    eps_high: float = 0.28,
    std_correction: int = 1,
    eps: float = 1e-6,
) -> Shaping:
    """CISPO: REINFORCE weighted by the clipped, detached ratio, ``-sg(clip(rho)) A log pi`` (GRPO advantages).

    No token leaves the gradient (the clip bounds the weight, not the update): the gradient is
    ``-sg(clip(rho, 1-eps_low, 1+eps_high)) A grad log pi``. On-policy (rho = 1) its gradient is
    GRPO's; its value is not a ratio (``-A log pi``).

    Shapes: ``rewards`` (B, G); ``logp``, ``logp_old``, ``mask`` (B, G, T) -> advantages (B, G).

    Hyper-parameters: ``eps_low`` 1.0 (no lower bound on the weight, as the paper) and
    ``eps_high`` 0.28 (the weight's cap is 1.28; the paper tunes only this one);
    ``std_correction``, ``eps``.

    Source: MiniMax 2025, arXiv 2506.13585 (MiniMax-M1, CISPO Eq. 4-5); verl
    ``compute_policy_loss_cispo``; docs/formulas.md §2.27
    """
    name = "cispo"
    logp, mask = _get(name, batch, "logp"), _get(name, batch, "mask")

    def surrogate(rho: Array, adv: Array) -> Array:
        xp = array_namespace(rho, logp)
        keep = core._bool_mask(xp, mask)
        weight = stop_gradient(xp.clip(rho, min=1.0 - eps_low, max=1.0 + eps_high))
        # A zero weight (rho = 0 under eps_low = 1) times log pi = -inf is read as its limit 0.
        lp = xp.where(keep & (weight > 0), logp, 0.0)
        return -weight * _expanded(xp, adv, rho) * lp

    return Shaping(_grpo_of(_rewards(name, batch), std_correction, eps), surrogate=surrogate)


def _log_prob_salt(xp: Any, logp_old: Array, keep: Array) -> Array:
    # The behaviour policy's log-probs in units of 2^-20 nats, as integers in [0, 2^31): what
    # makes one seed's draws differ from batch to batch (`core.batch_random_count`).
    nats = xp.where(keep, -stop_gradient(logp_old), xp.zeros_like(logp_old))
    return xp.astype(xp.floor(xp.clip(nats * 2.0**20, min=0.0, max=2.0**31 - 1)), xp.int64)


def _select_count(xp: Any, keep: Array, fraction: float, like: Array) -> Array:
    # max(floor(fraction * n_valid), 1): verl's count of selected tokens (a 0-d array).
    n = xp.sum(xp.astype(keep, like.dtype))
    return xp.maximum(xp.floor(fraction * n), 1.0)


@register(
    "clip_cov",
    bounds={"eps": ">= 0", "clip_cov_ratio": "in (0, 1]", "clip_cov_lb": ">= 0"},
)
def clip_cov(
    batch: Batch,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    std_correction: int = 1,
    eps: float = 1e-6,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    clip_cov_select: str = "top",
    clip_cov_seed: int = 0,
) -> Shaping:
    """Clip-Cov: detach the tokens whose covariance ``(A - mean A)(log pi - mean log pi)`` is in ``(lb, ub)`` (GRPO advantages).

    Of the tokens not already clipped by the surrogate and with covariance strictly inside
    ``(clip_cov_lb, clip_cov_ub)``, ``k = max(floor(clip_cov_ratio * n_tokens), 1)`` get zero
    loss and gradient; the others keep GRPO's clipped surrogate. Which ``k``
    (``clip_cov_select``): "random", the paper's and verl's, draws them uniformly
    (`core.batch_random_count`: verl's ``torch.randperm`` distribution, seeded by
    ``clip_cov_seed`` and the batch's ``logp_old``, so still a function of the inputs); "top"
    (the default, which the committed studies ran) takes the ``k`` of largest covariance (ties
    by position), the low end of verl's distribution of losses. Both take every eligible token when
    at most ``k`` are. Covariances: `core.token_covariance`.

    Shapes: ``rewards`` (B, G); ``logp``, ``logp_old``, ``mask`` (B, G, T) -> advantages (B, G).

    Hyper-parameters: ``clip_cov_ratio`` in (0, 1] (2e-4, verl's and the paper's), bounds
    ``clip_cov_lb`` 1.0 and ``clip_cov_ub`` 5.0 (both verl's), ``clip_cov_select`` "top" or
    "random", ``clip_cov_seed`` an integer in [0, 2^32) (read by "random");
    ``std_correction``, ``eps``.

    Source: Cui et al. 2025, arXiv 2505.22617 (Clip-Cov, §5); verl
    ``compute_policy_loss_clip_cov``; docs/formulas.md §2.25
    """
    name = "clip_cov"
    logp, mask = _get(name, batch, "logp"), _get(name, batch, "mask")
    logp_old = _get(name, batch, "logp_old")

    def surrogate(rho: Array, adv: Array) -> Array:
        xp = array_namespace(rho, logp)
        keep = core._bool_mask(xp, mask)
        loss = core.clipped_surrogate(rho, adv, eps_low=eps_low, eps_high=eps_high)
        a = _expanded(xp, adv, rho)
        by_clip = stop_gradient(-loss) < stop_gradient(rho) * a
        cov = core.token_covariance(adv, logp, keep)
        band = keep & ~by_clip & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        count = _select_count(xp, keep, clip_cov_ratio, rho)
        if clip_cov_select == "top":
            chosen = core.batch_top_count(cov, band, count)
        else:
            try:
                salt = _log_prob_salt(xp, logp_old, keep)
                chosen = core.batch_random_count(band, count, salt, seed=clip_cov_seed)
            except ValueError as err:
                raise ValueError(f"{name}: clip_cov_select = 'random': {err}") from None
        return xp.where(chosen, xp.zeros_like(loss), loss)

    return Shaping(_grpo_of(_rewards(name, batch), std_correction, eps), surrogate=surrogate)


@register("kl_cov", bounds={"eps": ">= 0", "kl_cov_ratio": "in (0, 1]", "ppo_kl_coef": ">= 0"})
def kl_cov(
    batch: Batch,
    *,
    std_correction: int = 1,
    eps: float = 1e-6,
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 1.0,
) -> Shaping:
    """KL-Cov: ``-rho A`` (no clip), plus ``ppo_kl_coef |log rho|`` on the top tokens by covariance (GRPO advantages).

    ``k = max(floor(kl_cov_ratio * n_tokens), 1)`` tokens of largest covariance
    ``(A - mean A)(log pi - mean log pi)`` (`core.token_covariance`; ties by position) get the
    penalty; no token is clipped (``eps_low`` / ``eps_high`` are not read), as verl's loss.

    Shapes: ``rewards`` (B, G); ``logp``, ``logp_old``, ``mask`` (B, G, T) -> advantages (B, G).

    Hyper-parameters: ``kl_cov_ratio`` in (0, 1] (2e-4, verl's default; the paper used 2e-3 for
    its 7B model), ``ppo_kl_coef`` >= 0 (1.0, verl's); ``std_correction``, ``eps``.

    Source: Cui et al. 2025, arXiv 2505.22617 (KL-Cov, §5); verl ``compute_policy_loss_kl_cov``;
    docs/formulas.md §2.25
    """
    name = "kl_cov"
    logp, logp_old, mask = (_get(name, batch, k) for k in ("logp", "logp_old", "mask"))

    def surrogate(rho: Array, adv: Array) -> Array:
        xp = array_namespace(rho, logp)
        keep = core._bool_mask(xp, mask)
        loss = -rho * _expanded(xp, adv, rho)
        cov = core.token_covariance(adv, logp, keep)
        count = _select_count(xp, keep, kl_cov_ratio, rho)
        chosen = core.batch_top_count(cov, keep & (cov > -math.inf), count)
        log_ratio = xp.where(keep, logp, 0.0) - xp.where(keep, logp_old, 0.0)
        return xp.where(chosen, loss + ppo_kl_coef * xp.abs(log_ratio), loss)

    return Shaping(_grpo_of(_rewards(name, batch), std_correction, eps), surrogate=surrogate)


@register(
    "entropy_adv", needs={"entropy"}, bounds={"eps": ">= 0", "alpha": ">= 0", "kappa": ">= 1"}
)
def entropy_adv(
    batch: Batch,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    std_correction: int = 1,
    eps: float = 1e-6,
    alpha: float = 0.4,
    kappa: float = 2.0,
) -> Shaping:
    """Entropy-based advantage: ``A_t = A + min(alpha sg(H_t), |A| / kappa)`` per token (GRPO's ``A``).

    The bonus is nonnegative and at most ``|A| / kappa`` with ``kappa >= 1``, so it never flips
    the sign of a negative advantage (at most brings it to 0); a zero advantage (uniform group)
    stays zero. The clipped surrogate takes
    the per-token advantage.

    Shapes: ``rewards`` (B, G); ``entropy``, ``logp``, ``logp_old``, ``mask`` (B, G, T) ->
    advantages (B, G) (the sequence part; the loss adds the token part).

    Hyper-parameters: ``alpha`` >= 0 (0.4) and ``kappa`` >= 1 (2.0), the paper's values;
    ``std_correction``, ``eps``.

    Source: Cheng et al. 2025, arXiv 2506.14758 ("Reasoning with Exploration: An Entropy
    Perspective", Eq. of the shaped advantage); docs/formulas.md §2.28
    """
    name = "entropy_adv"
    entropy = _get(name, batch, "entropy")

    def surrogate(rho: Array, adv: Array) -> Array:
        xp = array_namespace(rho, entropy)
        a = _expanded(xp, adv, rho)
        bonus = xp.minimum(alpha * stop_gradient(entropy), xp.abs(a) / kappa)
        return core.clipped_surrogate(rho, a + bonus, eps_low=eps_low, eps_high=eps_high)

    return Shaping(_grpo_of(_rewards(name, batch), std_correction, eps), surrogate=surrogate)


@register("lite_ppo", bounds={"eps": ">= 0"})
def lite_ppo(batch: Batch, *, std_correction: int = 1, eps: float = 1e-4) -> Array:
    """Group mean, batch std: ``A = (r - mean_G r) / (std_{B x G} r + eps)``.

    The baseline is the group's, the scale one for the whole batch (every reward of every
    group), so a group of near-equal rewards is not blown up to unit scale as GRPO's is.

    Shapes: ``rewards`` (B, G) -> advantages (B, G).

    Hyper-parameters: ``std_correction`` 1 = unbiased std over the B x G rewards (torch's
    ``std``), 0 = population; ``eps`` 1e-4 (TRL's). One reward (B G = 1) gets std 0.

    Source: Liu et al. 2025, arXiv 2508.08221 (Lite PPO: group-level mean, batch-level std);
    TRL ``GRPOConfig(scale_rewards="batch")``; docs/formulas.md §2.29
    """
    r = _rewards("lite_ppo", batch)
    xp = array_namespace(r)
    centred = core.dr_grpo_advantages(r)
    n = math.prod(r.shape)
    if n - std_correction <= 0:
        return xp.zeros_like(r)
    var = xp.sum((r - xp.mean(r)) ** 2) / (n - std_correction)
    # A batch of equal rewards with eps = 0 gets 0, as GRPO's constant group (never NaN).
    return core._safe_divide(xp, centred, xp.sqrt(var) + eps)


@register("grpo_passk", bounds={"eps": ">= 0"})
def grpo_passk(batch: Batch, *, std_correction: int = 1, eps: float = 1e-6) -> Array:
    """Best-of-k: only a group's best response is credited, ``A = (r_max - r_second) / (std r + eps)``.

    Every other response gets 0; with a tie at the top (``r_max = r_second``) the whole group
    gets 0. For binary rewards only a group with exactly one correct response learns. Trains
    for pass@G (the group size is k).

    Shapes: ``rewards`` (B, G) -> advantages (B, G).

    Hyper-parameters: ``std_correction`` (the group std's ddof, 1 as verl's ``torch.std``),
    ``eps``. A group of one (G = 1) gets 0.

    Source: Tang et al. 2025, arXiv 2503.19595 (pass@k via the best-of-k leave-one-out
    advantage); verl ``compute_grpo_passk_outcome_advantage``; docs/formulas.md §2.30
    """
    r = _rewards("grpo_passk", batch)
    xp = array_namespace(r)
    if r.shape[-1] < 2:
        return xp.zeros_like(r)
    top2 = top_k(r, 2, largest=True)
    gap = top2[..., 0:1] - top2[..., 1:2]
    n = r.shape[-1]
    dof = n - std_correction
    mean = xp.mean(r, axis=-1, keepdims=True)
    std = xp.sqrt(xp.sum((r - mean) ** 2, axis=-1, keepdims=True) / dof)
    best = (r == top2[..., 0:1]) & (gap > 0)
    # A constant group with eps = 0 divides 0 by 0 where no response is best, masked below: NumPy
    # is told not to warn of it (the expression itself unchanged: XLA's compiled bytes depend on it).
    quiet = np.errstate(divide="ignore", invalid="ignore") if is_numpy_array(r) else nullcontext()
    with quiet:
        scaled = gap / (std + eps)
    return xp.where(best, scaled * xp.ones_like(r), xp.zeros_like(r))


@register("pkpo", sizes={"G": "k"})
def pkpo(batch: Batch, *, k: int = 4) -> Array:
    """PKPO: ``A_i = k E_T[max(r_i, max_T r) - max_T r]``, ``T`` a (k-1)-subset of the others.

    This is ``A_i = G s_i^(loo-1)``, the paper's lowest-variance gradient weight (Eq. 33) times
    the group size ``n = G``: ``s_i^(loo-1) = s_i - (k/n) rho_{k-1}(others)``, where
    ``s_i = C(n, k)^-1 sum_{|S| = k, S contains i} max_S r`` (Eqs. 19, 27) is the unbiased
    weight of response i in the gradient of ``max_r@k = E[max of k rewards]`` (pass@k for
    binary rewards) and ``rho_{k-1}(others)`` is the unbiased max@(k-1) estimate (Eq. 12) from
    the other ``n - 1`` responses (it does not depend on response i, so the estimate stays
    unbiased). Computed pairwise, without enumerating subsets:
    ``A_i = k sum_{j: r_j < r_i} w_j (r_i - r_j)`` with
    ``w_j = C(rank_j, k-2) / C(n-1, k-1)`` the probability that response j (0-based ascending
    rank) is the best of a uniform (k-1)-subset of the others; tied rewards contribute 0, so the
    result does not depend on how ties are ranked. Binary rewards: a correct response gets
    ``k C(n-c, k-1) / C(n-1, k-1)`` (``c`` correct in the group), an incorrect one 0. For k >= 2
    every advantage is >= 0; a group of equal rewards gets 0 for every k.

    Normalisation: the paper's estimator is ``sum_i s_i grad log pi(y_i)``; the loss averages
    over a group's responses, so ``A = n s`` makes the group's mean of ``A_i grad log pi(y_i)``
    exactly that estimator, and k = 1 has the scale of REINFORCE leave-one-out (below).

    ``k = 1``: the (k-1)-subset is empty and Eq. 33 has no baseline (with the maximum of an
    empty set read as 0, ``A_i = r_i``). We use the leave-one-out mean baseline the paper trains
    its k_opt = 1 runs with (Eq. 26, §5.2):
    ``A_i = r_i - mean_{j != i} r_j = G/(G-1) (r_i - mean_G r)``, still unbiased for
    ``grad E[r]``. A group of one (G = 1) gets 0.

    Shapes: ``rewards`` (B, G) (binary or continuous) -> advantages (B, G).

    Hyper-parameters: ``k`` integer in [1, G] (default 4, within the paper's
    ``k_opt in {1, 2, 4, 8}`` at n = 16); a traced ``k`` is not range-checked. The loss is
    GRPO's clipped surrogate of these advantages.

    Raises:
        ValueError: a concrete ``k`` outside [1, G] (the message names ``k`` and G).

    Source: Walder & Karkhanis 2025, arXiv 2505.15201 (PKPO: Eq. 12 max@k estimate, Eqs. 19/27
    gradient weight s_i, Eq. 33 the (k-1) leave-one-out baseline s^(loo-1); §5.2 and Eq. 26 the
    leave-one-out mean at k = 1); docs/formulas.md §2.34
    """
    r = _rewards("pkpo", batch)
    xp = array_namespace(r)
    n = r.shape[-1]
    if _concrete(k) and not 1 <= k <= n:
        raise ValueError(f"pkpo: k must satisfy 1 <= k <= G = {n}, got k={k!r}")
    if n < 2:
        return xp.zeros_like(r)
    diff = xp.expand_dims(r, axis=-1) - xp.expand_dims(r, axis=-2)  # (B, G_i, G_j): r_i - r_j
    loo = xp.sum(diff, axis=-1) / (n - 1)
    if _concrete(k) and k == 1:
        return loo
    # w_j = C(rank_j, k-2)/C(n-1, k-1) = (k-1)/(n-1) prod_{t<k-2} (rank_j - t)/(n-2-t); a rank
    # below k-2 meets the factor t = rank_j and gets 0. The product runs over t < G.
    rank = xp.expand_dims(core.group_rank(r), axis=-1)  # (B, G, 1)
    t = xp.arange(n, dtype=r.dtype, device=device(r))
    used = t < k - 2
    den = xp.where(used, n - 2.0 - t, 1.0)
    w = (k - 1) / (n - 1) * xp.prod(xp.where(used, (rank - t) / den, 1.0), axis=-1)  # (B, G)
    adv = k * xp.sum(xp.maximum(diff, 0.0) * xp.expand_dims(w, axis=-2), axis=-1)
    if _concrete(k):
        return adv
    return xp.where(k == 1, loo, adv)
