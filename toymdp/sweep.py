"""`python -m toymdp sweep --config FILE [--out DIR]`: hyper-parameter sweeps and trade-off frontiers.

A TOML file names the environment, the training, the methods with a grid of hyper-parameter
values each, the seeds and the evaluation steps (see `configs/toy/*.toml`; every key below):

```toml
[env]
kind = "dataset"          # "dataset" (multi-prompt, held-out split) or "single" (one prompt)
num_actions = 4           # V
depth = 3                 # H
draws = [0, 1, 2]         # environment draw seeds (a dataset or a tree per seed)
skew = 1.0                # base logits ~ Normal(0, skew²); 0 = uniform base policy
base_correctness = 0.02   # tilt every prompt's base correctness to this value (optional)
# dataset only (the popularity dataset of figure 6, `toymdp.experiments.passk`):
multiplicities = [1, 2, 4, 8, 16]
per_size = 8              # training and held-out prompts per multiplicity
zipf = 1.0
# single only: `correct = ["ABC", ...]` (labels) or `correct_size = 6` (random per draw)

[train]
optimizer = "adam"        # or "sgd"
lr = 0.1
updates = 100             # U
group_size = 8            # G
epochs = 1                # μ
kl_coef = 0.0             # default of every method's `kl_coef` (a grid may sweep it)
seeds = 4                 # training seeds per run (paired across methods)
seed = 0                  # root of the training keys
eval_steps = [0, 25, 50, 75, 100]
pass_k = [1, 4, 16, 64]
distinct_k = 16
fast_compile = false

[frontier]
reference = ["grpo"]      # labels of the entries forming the reference curve
num_resamples = 2000

[[methods]]
method = "ds_grpo"        # a `shaping.METHODS` name
label = "ds_grpo"         # optional (default: method); unique
hyper = { gamma_n = 0.0 } # fixed overrides
grid = { gamma_p = [0.03, 0.1, 0.3, 1.0] }        # Cartesian product of these values
zip = { eta_pos = [0.1, 0.3], eta_neg = [0.1, 0.3] } # optional: aligned lists (one axis)
```

Execution (PureJaxRL style): float hyper-parameters of a method and the learning rate are
*data* (`toymdp.train.TrainConfig.swept_names`), so each `[[methods]]` entry is one compiled
program, `vmap` over draws × settings × seeds; the environment's arrays are data too
(`toymdp.experiments.methods.train_over_envs`). Non-float hyper-parameters in a grid (CaSP's
`top_n`, pass@k training's `k`, ...) change the program and cost one compilation per value.

Outputs in OUT (default ``runs/toy_sweep/<config stem>``):

- ``results.json``: per run (entry × setting) its metrics, means over the training and over the
  held-out prompts, with axes `(D draws, R seeds, T eval steps[, k])`: ``correctness``,
  ``pass_at_k``, ``distinct_correct``, ``normalized_variance``, ``kl_to_base``, ``entropy``;
  and the frontier lifts (`frontier`).
- ``frontier.png``: pass@k_max gain and distinct-correct gain against pass@1 gain, on the
  held-out prompts (training prompts for a single prompt), every method's final points and
  upper envelope against the reference's curve (every checkpoint of every reference setting).
- ``lifts.md``: lift at matched pass@1 over the reference curve with paired 95% bootstrap CIs
  (`experiment.frontier.bootstrap_lift`; problems = held-out prompts of every draw, seeds =
  training seeds).

Results are cached in ``OUT/.cache/sweep-<code hash>-<config hash>.npz`` (as `toymdp.figures`):
a rerun with unchanged code and config only redraws.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

import numerics
import shaping
from experiment import frontier, store
from theory import trees
from toymdp import train as T
from toymdp.env import TreeEnv
from toymdp.figures import _enable_jax_cache, code_hash
from toymdp.train import OPTIMIZERS

KINDS = ("dataset", "single")
METRICS = (
    "correctness",
    "pass_at_k",
    "distinct_correct",
    "normalized_variance",
    "kl_to_base",
    "entropy",
)


# ------------------------------------------------------------------------------ configuration


@dataclass(frozen=True)
class EnvSpec:
    """`[env]`: the environment and its draws (module docstring)."""

    kind: str = "dataset"
    num_actions: int = 4
    depth: int = 3
    draws: tuple[int, ...] = (0,)
    skew: float = 1.0
    base_correctness: float | None = None
    multiplicities: tuple[int, ...] = (1, 2, 4, 8, 16)
    per_size: int = 8
    zipf: float = 1.0
    correct: tuple[str, ...] | None = None
    correct_size: int | None = None


@dataclass(frozen=True)
class TrainSpec:
    """`[train]`: training, seeds and evaluation (module docstring)."""

    optimizer: str = "adam"
    lr: float = 0.1
    updates: int = 100
    group_size: int = 8
    epochs: int = 1
    kl_coef: float = 0.0
    seeds: int = 4
    seed: int = 0
    eval_steps: tuple[int, ...] = ()
    pass_k: tuple[int, ...] = (1, 4, 16, 64)
    distinct_k: int = 16
    fast_compile: bool = False


@dataclass(frozen=True)
class MethodSpec:
    """One `[[methods]]` entry."""

    method: str
    label: str
    hyper: dict[str, object] = field(default_factory=dict)
    grid: dict[str, tuple] = field(default_factory=dict)
    zip: dict[str, tuple] = field(default_factory=dict)


@dataclass(frozen=True)
class SweepConfig:
    """A parsed, validated sweep configuration (`load_config`)."""

    env: EnvSpec
    train: TrainSpec
    methods: tuple[MethodSpec, ...]
    reference: tuple[str, ...]
    num_resamples: int = 2000
    raw: Mapping[str, Any] = field(default_factory=dict)

    def digest(self) -> str:
        """SHA-256 (12 hex digits) of the configuration's canonical JSON."""
        text = json.dumps(self.raw, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def _fields(section: str, table: object, cls: type) -> dict[str, Any]:
    if not isinstance(table, Mapping):
        raise ValueError(f"[{section}] must be a table, got {type(table).__name__}")
    known = set(cls.__dataclass_fields__)
    unknown = sorted(set(table) - known)
    if unknown:
        raise ValueError(f"{section}: unknown key(s) {unknown}; known: {sorted(known)}")
    out = dict(table)
    for name, value in out.items():
        default = cls.__dataclass_fields__[name].default
        if isinstance(value, list):
            out[name] = tuple(value)
        elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def _int_list(where: str, values: object, minimum: int) -> None:
    if not isinstance(values, tuple) or not values:
        raise ValueError(f"{where} must be a non-empty list of integers, got {values!r}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"{where} must hold integers >= {minimum}, got {v!r}")


def _check_type(where: str, value: object, kind: type | tuple) -> None:
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise ValueError(f"{where} has the wrong type: {value!r}")


def parse_config(doc: Mapping[str, Any]) -> SweepConfig:
    """Validate a TOML document (a dict) into a `SweepConfig`.

    Raises:
        ValueError: naming the section and key of the first bad value.
    """
    unknown = sorted(set(doc) - {"env", "train", "methods", "frontier"})
    if unknown:
        raise ValueError(f"unknown section(s) {unknown}; known: env, train, methods, frontier")
    env = EnvSpec(**_fields("env", doc.get("env", {}), EnvSpec))
    if env.kind not in KINDS:
        raise ValueError(f"env.kind must be one of {list(KINDS)}, got {env.kind!r}")
    for name in ("num_actions", "depth", "per_size"):
        _int_list(f"env.{name}", (getattr(env, name),), 1)
    if env.num_actions < 2:
        raise ValueError(f"env.num_actions must be >= 2, got {env.num_actions}")
    _int_list("env.draws", env.draws, 0)
    _int_list("env.multiplicities", env.multiplicities, 1)
    m = env.num_actions**env.depth
    if max(env.multiplicities) > m:
        raise ValueError(f"env.multiplicities must be <= M = {m}, got {env.multiplicities}")
    _check_type("env.skew", env.skew, float)
    if env.skew < 0:
        raise ValueError(f"env.skew must be >= 0, got {env.skew}")
    bc = env.base_correctness
    if bc is not None and (
        isinstance(bc, bool) or not isinstance(bc, int | float) or not 0 < bc < 1
    ):
        raise ValueError(f"env.base_correctness must be in (0, 1), got {env.base_correctness!r}")
    if env.kind == "single" and (env.correct is None) == (env.correct_size is None):
        raise ValueError("env: a single prompt needs exactly one of `correct` or `correct_size`")
    if env.correct_size is not None and not 1 <= env.correct_size <= m:
        raise ValueError(f"env.correct_size must be in [1, M = {m}], got {env.correct_size!r}")

    tr = TrainSpec(**_fields("train", doc.get("train", {}), TrainSpec))
    if tr.optimizer not in OPTIMIZERS:
        raise ValueError(f"train.optimizer must be one of {list(OPTIMIZERS)}, got {tr.optimizer!r}")
    for name in ("updates", "group_size", "epochs", "seeds", "distinct_k"):
        _int_list(f"train.{name}", (getattr(tr, name),), 1)
    _int_list("train.seed", (tr.seed,), 0)
    _int_list("train.pass_k", tr.pass_k, 1)
    for name in ("lr", "kl_coef"):
        _check_type(f"train.{name}", getattr(tr, name), float)
    if tr.lr <= 0:
        raise ValueError(f"train.lr must be > 0, got {tr.lr}")
    steps = tr.eval_steps or tuple(np.linspace(0, tr.updates, 5).round().astype(int).tolist())
    _int_list("train.eval_steps", steps, 0)
    if max(steps) > tr.updates:
        raise ValueError(f"train.eval_steps must be <= train.updates = {tr.updates}, got {steps}")
    # Step 0 is the base policy (the origin of every gain) and U the final policy.
    tr = TrainSpec(**{**tr.__dict__, "eval_steps": tuple(sorted({0, *steps, tr.updates}))})

    entries = doc.get("methods")
    if not isinstance(entries, list) or not entries:
        raise ValueError("methods: at least one [[methods]] entry is required")
    methods = tuple(_parse_method(i, e) for i, e in enumerate(entries))
    labels = [m.label for m in methods]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"methods: duplicate label(s) {dup}; give each entry its own `label`")

    fr = doc.get("frontier", {})
    if not isinstance(fr, Mapping) or set(fr) - {"reference", "num_resamples"}:
        raise ValueError("[frontier] may hold only `reference` and `num_resamples`")
    ref = fr.get("reference", [m.label for m in methods if m.method == "grpo"])
    ref = (ref,) if isinstance(ref, str) else tuple(ref)
    missing = sorted(set(ref) - set(labels))
    if not ref or missing:
        raise ValueError(
            f"frontier.reference must name method labels (default: the grpo entries); "
            f"unknown or none: {missing or ref!r}; labels: {labels}"
        )
    num_resamples = fr.get("num_resamples", 2000)
    _int_list("frontier.num_resamples", (num_resamples,), 1)
    return SweepConfig(env, tr, methods, ref, num_resamples, dict(doc))


def _parse_method(i: int, entry: object) -> MethodSpec:
    where = f"methods[{i}]"
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be a table")
    unknown = sorted(set(entry) - {"method", "label", "hyper", "grid", "zip"})
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {unknown}; known: hyper, grid, label, method, zip"
        )
    name = entry.get("method")
    if name not in shaping.METHODS:
        raise ValueError(
            f"{where}.method: unknown method {name!r}; known: {sorted(shaping.METHODS)}"
        )
    defaults = shaping.METHODS[name].defaults
    known = {"lr", *defaults}
    axes: dict[str, dict[str, tuple]] = {}
    for part in ("hyper", "grid", "zip"):
        table = entry.get(part, {})
        if not isinstance(table, Mapping):
            raise ValueError(f"{where}.{part} must be a table")
        bad = sorted(set(table) - known)
        if bad:
            raise ValueError(
                f"{where}.{part}: unknown hyper-parameter(s) {bad} for {name!r}; known: {sorted(known)}"
            )
        axes[part] = dict(table)
    for part in ("grid", "zip"):
        for key, values in axes[part].items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"{where}.{part}.{key} must be a non-empty list, got {values!r}")
            axes[part][key] = tuple(values)
    lengths = {len(v) for v in axes["zip"].values()}
    if len(lengths) > 1:
        raise ValueError(f"{where}.zip: lists must have equal lengths, got {sorted(lengths)}")
    for key in axes["zip"]:
        if not _is_data(name, key):
            raise ValueError(f"{where}.zip.{key}: only float hyper-parameters (data) can be zipped")
    overlap = sorted(
        set(axes["grid"]) & set(axes["zip"])
        | (set(axes["hyper"]) & (set(axes["grid"]) | set(axes["zip"])))
    )
    if overlap:
        raise ValueError(f"{where}: {overlap} given more than once among hyper, grid and zip")
    if "lr" in axes["hyper"]:
        raise ValueError(f"{where}.hyper.lr: set the learning rate in [train] or sweep it in grid")
    return MethodSpec(name, str(entry.get("label", name)), axes["hyper"], axes["grid"], axes["zip"])


def _is_data(method: str, name: str) -> bool:
    """Whether `name` is traced (swept as data): the learning rate and float hyper-parameters."""
    default = shaping.METHODS[method].defaults.get(name)
    return name == "lr" or (isinstance(default, float) and name not in T._STATIC)


def load_config(path: Path) -> SweepConfig:
    """Read and validate a sweep TOML file.

    Raises:
        ValueError: naming the file and the bad key (TOML syntax errors included).
    """
    try:
        doc = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: invalid TOML: {err}") from None
    try:
        return parse_config(doc)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


# ------------------------------------------------------------------------------ environments


def _tilt(log_pb: np.ndarray, correct: np.ndarray, target: float) -> np.ndarray:
    """Rescale each row's mass on `C` to `target` (and off `C` to `1 − target`), keeping the
    base policy's preferences within `C` and within its complement (as figure 6)."""
    log_pc = np.logaddexp.reduce(np.where(correct, log_pb, -np.inf), axis=-1, keepdims=True)
    log_pw = np.logaddexp.reduce(np.where(correct, -np.inf, log_pb), axis=-1, keepdims=True)
    return np.where(correct, np.log(target) + log_pb - log_pc, np.log1p(-target) + log_pb - log_pw)


def popularity_dataset(rng: np.random.Generator, spec: EnvSpec) -> TreeEnv:
    """Figure 6's popularity dataset (`toymdp.experiments.passk.toy_dataset`) with its constants
    as arguments: `per_size` training then `per_size` held-out prompts per multiplicity.

    Returns:
        A `TreeEnv` with `P = 2·per_size·len(multiplicities)` prompts, `sharing="factored"`.
    """
    v, h = spec.num_actions, spec.depth
    m = trees.num_trajectories(v, h)
    popularity = np.empty(m)
    popularity[rng.permutation(m)] = 1.0 / np.arange(1, m + 1) ** spec.zipf
    popularity /= popularity.sum()
    sizes = np.tile(np.repeat(spec.multiplicities, spec.per_size), 2)  # (P,)
    correct = np.zeros((sizes.size, m), dtype=bool)
    for p, size in enumerate(sizes):
        correct[p, rng.choice(m, size=size, replace=False, p=popularity)] = True
    log_pb = trees.trajectory_log_probs(
        np.stack([trees.random_base_logits(rng, v, h, spec.skew) for _ in sizes]), v, h
    )
    if spec.base_correctness is not None and not correct.all():
        log_pb = _tilt(log_pb, correct, float(spec.base_correctness))
    base = trees.logits_from_log_probs(log_pb, v, h)
    train = np.arange(sizes.size) < sizes.size // 2
    return TreeEnv(v, h, correct, base, train, sharing="factored")


def single_prompt(rng: np.random.Generator, spec: EnvSpec) -> TreeEnv:
    """One prompt: correct set by labels or drawn at random, base uniform (`skew = 0`) or random."""
    v, h = spec.num_actions, spec.depth
    m = trees.num_trajectories(v, h)
    correct = np.zeros((1, m), dtype=bool)
    if spec.correct is not None:
        labels = {lab: i for i, lab in enumerate(trees.trajectory_labels(v, h))}
        for item in spec.correct:
            if item not in labels:
                raise ValueError(f"env.correct: {item!r} is not a trajectory of V={v}, H={h}")
            correct[0, labels[item]] = True
    else:
        correct[0, rng.choice(m, size=spec.correct_size, replace=False)] = True
    n_int = trees.num_internal_nodes(v, h)
    logits = (
        trees.random_base_logits(rng, v, h, spec.skew) if spec.skew > 0 else np.zeros((n_int, v))
    )
    log_pb = trees.trajectory_log_probs(logits[None], v, h)
    if spec.base_correctness is not None and not correct.all():
        log_pb = _tilt(log_pb, correct, float(spec.base_correctness))
    base = trees.logits_from_log_probs(log_pb, v, h)
    return TreeEnv(v, h, correct, base, np.ones(1, dtype=bool))


def environments(spec: EnvSpec) -> list[TreeEnv]:
    """One environment per draw seed (`spec.draws`)."""
    build = popularity_dataset if spec.kind == "dataset" else single_prompt
    return [build(np.random.default_rng(d), spec) for d in spec.draws]


# ------------------------------------------------------------------------------ running


@dataclass(frozen=True)
class Run:
    """One row of the sweep: an entry and one combination of its grid values."""

    label: str
    method: str
    values: dict[str, object]  # the swept values (grid and zip) of this row
    static: dict[str, object]  # non-float grid values (fixed by the compiled program)

    def setting(self) -> str:
        """A short label, e.g. ``"gamma_p=0.1, gamma_n=0.05"`` (``"default"`` without a grid)."""
        return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in self.values.items()) or "default"  # fmt: skip


def expand(spec: MethodSpec) -> list[Run]:
    """The rows of one entry: Cartesian product of `grid` × the aligned `zip` lists."""
    names = list(spec.grid)
    zipped = list(zip(*spec.zip.values(), strict=True)) if spec.zip else [()]
    rows = []
    for combo in itertools.product(*(spec.grid[k] for k in names)):
        for zrow in zipped:
            values = {
                **dict(zip(names, combo, strict=True)),
                **dict(zip(spec.zip, zrow, strict=True)),
            }
            static = {k: v for k, v in values.items() if not _is_data(spec.method, k)}
            rows.append(Run(spec.label, spec.method, values, static))
    return rows


def _train_config(
    cfg: SweepConfig, env: TreeEnv, spec: MethodSpec, static: Mapping
) -> T.TrainConfig:
    tr = cfg.train
    hyper = {"kl_coef": tr.kl_coef, **spec.hyper, **static}
    try:
        return T.TrainConfig(
            env, method=spec.method, method_hyper=hyper, group_size=tr.group_size,
            num_updates=tr.updates, num_epochs=tr.epochs, optimizer=tr.optimizer,
            learning_rate=tr.lr, pass_k=tr.pass_k, distinct_k=(tr.distinct_k,),
        )  # fmt: skip
    except ValueError as err:
        raise ValueError(f"methods[{spec.label}]: {err}") from None


def run_program(
    cfg: SweepConfig, envs: Sequence[TreeEnv], spec: MethodSpec, runs: Sequence[Run]
) -> dict[str, np.ndarray]:
    """Train the rows `runs` (sharing one `static` combination) on every draw × seed, compiled
    once.

    Returns:
        `{metric: (N rows, D draws, R seeds, T eval steps, P[, k])}` per-prompt exact metrics.
    """
    from toymdp.experiments.bias import run_compiled
    from toymdp.experiments.methods import train_over_envs

    config = _train_config(cfg, envs[0], spec, runs[0].static)
    settings = T.stack_settings([
        T.default_settings(config, **{k: float(v) for k, v in r.values.items() if k not in r.static})
        for r in runs
    ])  # fmt: skip
    keys = T.seed_keys(cfg.train.seed, cfg.train.seeds)
    steps = np.asarray(cfg.train.eval_steps)
    train = jax.vmap(train_over_envs(config), (None, None, None, 0))  # seeds
    train = jax.vmap(train, (None, None, 0, None))  # settings
    train = jax.vmap(train, (0, 0, None, None))  # draws
    base = np.stack([e.base_logits for e in envs]).astype(np.float32)
    correct = np.stack([e.correct for e in envs])

    def program(settings: T.Settings, keys: jax.Array) -> dict[str, jax.Array]:
        exact = train(base, correct, settings, keys)["exact"]  # (D, N, R, U + 1, P, ...)
        out = {k: exact[k][:, :, :, steps] for k in METRICS}
        out["distinct_correct"] = out["distinct_correct"][..., 0]
        return out

    if cfg.train.fast_compile:
        out = jax.tree.map(
            np.asarray, jax.jit(program, compiler_options=T.FAST_COMPILE)(settings, keys)
        )
    else:
        out = run_compiled(program, settings, keys)
    return {k: np.swapaxes(v, 0, 1).astype(np.float32) for k, v in out.items()}


def run_sweep(cfg: SweepConfig, progress: bool = True) -> dict[str, Any]:
    """Every entry of `cfg` (one compiled program per entry and non-float grid combination).

    Returns:
        ``rows`` (the `Run`s, in order), ``train_prompts`` `(P,)`, and per metric the stacked
        `(N, D, R, T, P[, k])` arrays.
    """
    from tqdm import tqdm

    envs = environments(cfg.env)
    rows = all_rows(cfg)
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault((r.label, tuple(sorted(r.static.items()))), []).append(i)
    specs = {s.label: s for s in cfg.methods}
    arrays: dict[str, list[np.ndarray]] = {k: [] for k in METRICS}
    order: list[int] = []
    bar = tqdm(list(groups.items()), desc="toy sweep", unit="program", disable=not progress)
    for (label, _), index in bar:
        bar.set_postfix_str(f"{label} ({len(index)} settings)")
        out = run_program(cfg, envs, specs[label], [rows[i] for i in index])
        for k in METRICS:
            arrays[k].append(out[k])
        order.extend(index)
    return {
        "rows": [rows[i] for i in order],
        "row_order": np.array(order),
        "train_prompts": envs[0].train_prompts.copy(),
        **{k: np.concatenate(v) for k, v in arrays.items()},
    }


def all_rows(cfg: SweepConfig) -> list[Run]:
    """Every row of the sweep, entries in config order (`expand`)."""
    return [r for spec in cfg.methods for r in expand(spec)]


# ------------------------------------------------------------------------------ frontier


def frontier_data(cfg: SweepConfig, res: Mapping[str, Any], metric: str) -> dict[str, Any]:
    """Per-problem gains for `experiment.frontier`: problems = held-out prompts of every draw (the
    training prompts when nothing is held out), seeds = training seeds.

    Models: every eval step of every reference row, and the final step of the other rows.

    Args:
        metric: ``"pass_at_k"`` (at the largest k) or ``"distinct_correct"``.

    Returns:
        ``x``, ``y`` `(M, R, D·P')` gains over the base policy (step 0), ``models``, ``row``
        `(M,)` the row index of each model, ``base_x``, ``base_y`` the base means.
    """
    train = np.asarray(res["train_prompts"])
    sel = ~train if (~train).any() else train
    corr = res["correctness"][..., sel]  # (N, D, R, T, P')
    div = res[metric][..., sel, -1] if metric == "pass_at_k" else res[metric][..., sel]

    def per_problem(a: np.ndarray) -> np.ndarray:  # (N, D, R, T, P') -> (N, T, R, D·P')
        n, d, r, t, p = a.shape
        return a.transpose(0, 3, 2, 1, 4).reshape(n, t, r, d * p)

    cx, dy = per_problem(corr), per_problem(div)
    bx, by = cx[0, 0], dy[0, 0]  # step 0: the base policy, the same for every row
    rows: list[Run] = res["rows"]
    ref = set(cfg.reference)
    steps = cfg.train.eval_steps
    picks = [
        (i, t)
        for i, r in enumerate(rows)
        for t in (range(len(steps)) if r.label in ref else [len(steps) - 1])
    ]
    models = frontier.Models(
        [rows[i].label for i, _ in picks], [rows[i].setting() for i, _ in picks],
        [steps[t] for _, t in picks],
    )  # fmt: skip
    x = np.stack([cx[i, t] - bx for i, t in picks]).astype(np.float64)
    y = np.stack([dy[i, t] - by for i, t in picks]).astype(np.float64)
    return {
        "x": x, "y": y, "models": models, "row": np.array([i for i, _ in picks]),
        "base_x": float(bx.mean()), "base_y": float(by.mean()),
    }  # fmt: skip


def analyse(cfg: SweepConfig, res: Mapping[str, Any]) -> dict[str, Any]:
    """Lifts over the reference curve for pass@k_max and distinct correct (`bootstrap_lift`)."""
    out = {}
    for metric in ("pass_at_k", "distinct_correct"):
        data = frontier_data(cfg, res, metric)
        lift = frontier.bootstrap_lift(
            data["x"], data["y"], data["models"], cfg.reference,
            num_resamples=cfg.num_resamples, seed=cfg.train.seed,
        )  # fmt: skip
        out[metric] = {"data": data, "lift": lift}
    return out


def _metric_name(cfg: SweepConfig, metric: str) -> str:
    if metric == "pass_at_k":
        return f"pass@{max(cfg.train.pass_k)}"
    return f"distinct correct (K = {cfg.train.distinct_k})"


def plot_frontier(cfg: SweepConfig, analysis: Mapping[str, Any], path: Path) -> Path:
    """`frontier.png`: one panel per diversity measure (module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from toymdp.experiments._plot import METHOD_COLORS

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    labels = [m.label for m in cfg.methods]
    palette = plt.get_cmap("tab20")
    for ax, (metric, item) in zip(axes, analysis.items(), strict=True):
        res: frontier.LiftResult = item["lift"]
        sy = 100.0 if metric == "pass_at_k" else 1.0  # pass@k in points; distinct as counts
        ref = res.reference
        env = frontier.upper_envelope(res.x[ref], res.y[ref])
        ax.scatter(100 * res.x[ref], sy * res.y[ref], s=10, color="0.6", zorder=2)
        grid = np.linspace(env.x_min, env.x_max, 200)
        ax.plot(100 * grid, sy * env(grid), color="k", lw=2,
                label=f"reference ({', '.join(cfg.reference)}): every checkpoint")  # fmt: skip
        for j, label in enumerate(labels):
            if label in cfg.reference:
                continue
            idx = res.models.select(label)
            color = METHOD_COLORS.get(label, palette(j % 20))
            ax.scatter(100 * res.x[idx], sy * res.y[idx], s=18, color=color, zorder=3)
            menv = frontier.upper_envelope(res.x[idx], res.y[idx])
            if menv.vx.size > 1:
                ax.plot(100 * menv.vx, sy * menv.vy, color=color, lw=1.2, label=label)
            else:
                ax.plot([], [], color=color, marker="o", label=label)
        ax.axhline(0.0, color="0.8", lw=0.8, ls=":")
        ax.axvline(0.0, color="0.8", lw=0.8, ls=":")
        unit = " (points)" if metric == "pass_at_k" else ""
        ax.set_xlabel("pass@1 gain over the base policy (points)")
        ax.set_ylabel(f"{_metric_name(cfg, metric)} gain over the base policy{unit}")
        ax.set_title(f"{_metric_name(cfg, metric)} against pass@1: final points and envelopes")
    axes[0].legend(fontsize=7, loc="best")
    split = "held-out" if cfg.env.kind == "dataset" else "training"
    fig.text(
        0.5, -0.02,
        f"{split} prompts of {len(cfg.env.draws)} environment draw(s); means over "
        f"{cfg.train.seeds} seeds; {cfg.train.optimizer} lr {cfg.train.lr:g}, G = "
        f"{cfg.train.group_size}, U = {cfg.train.updates}. Lines: monotone upper envelopes "
        "(experiment.frontier).", ha="center", va="top", fontsize=8,
    )  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def _round(a: np.ndarray) -> list:
    return np.round(np.asarray(a, dtype=np.float64), 6).tolist()


def _finite(v: float) -> float | None:
    return None if not np.isfinite(v) else round(float(v), 6)


def results_doc(cfg: SweepConfig, res: Mapping[str, Any], analysis: Mapping[str, Any]) -> dict:
    """The JSON document of `results.json` (module docstring)."""
    train = np.asarray(res["train_prompts"])
    splits = [("train", train)] + ([("heldout", ~train)] if (~train).any() else [])
    runs = []
    for i, row in enumerate(res["rows"]):
        metrics = {}
        for split, sel in splits:
            for k in METRICS:
                a = res[k][i]  # (D, R, T, P[, k])
                axis = -2 if k == "pass_at_k" else -1
                metrics[f"{split}/{k}"] = _round(np.compress(sel, a, axis=axis).mean(axis=axis))
        runs.append({
            "label": row.label, "method": row.method, "setting": row.setting(),
            "values": row.values, "metrics": metrics,
        })  # fmt: skip
    lifts = {}
    for metric, item in analysis.items():
        lr: frontier.LiftResult = item["lift"]
        lifts[metric] = {
            "measure": _metric_name(cfg, metric),
            "base_x": item["data"]["base_x"],
            "base_y": item["data"]["base_y"],
            "models": [
                {
                    "label": lr.models.method[m],
                    "setting": lr.models.setting[m],
                    "step": lr.models.step[m],
                    "reference": bool(m in set(lr.reference.tolist())),
                    "x": _finite(lr.x[m]),
                    "y": _finite(lr.y[m]),
                    "lift": _finite(lr.lift[m]),
                    "lo": _finite(lr.lo[m]),
                    "hi": _finite(lr.hi[m]),
                    "status": str(lr.status[m]),
                    "inside_fraction": _finite(lr.inside_fraction[m]),
                }
                for m in range(len(lr.models))
            ],
        }
    return {
        "config": cfg.raw,
        "numerics": numerics.tag(),
        "axes": {
            "draws": list(cfg.env.draws),
            "seeds": cfg.train.seeds,
            "eval_steps": list(cfg.train.eval_steps),
            "pass_k": list(cfg.train.pass_k),
            "layout": "metrics[split/name]: (draws, seeds, eval_steps[, pass_k]), prompt means",
        },
        "runs": runs,
        "frontier": lifts,
    }


def lifts_markdown(cfg: SweepConfig, analysis: Mapping[str, Any]) -> str:
    """`lifts.md`: one table per diversity measure (`experiment.frontier.lift_table`)."""
    split = "held-out" if cfg.env.kind == "dataset" else "training"
    parts = [
        "# Lift at matched pass@1 over the reference curve\n",
        f"Reference: {', '.join(cfg.reference)} (every checkpoint of every setting). Points are "
        f"gains over the base policy on the {split} prompts of {len(cfg.env.draws)} draw(s), "
        f"means over {cfg.train.seeds} seeds, at the final step {cfg.train.updates}. CIs: paired "
        f"percentile bootstrap over seeds and problems ({cfg.num_resamples} resamples); `inside`: "
        "fraction of resamples where the point lies in the reference's pass@1 range.\n",
    ]
    for metric, item in analysis.items():
        scale = 100.0 if metric == "pass_at_k" else 1.0
        unit = "percentage points" if scale == 100 else "expected distinct correct responses"
        d = item["data"]
        parts.append(
            f"\n## {_metric_name(cfg, metric)} ({unit}; base pass@1 {100 * d['base_x']:.2f} "
            f"points, base {_metric_name(cfg, metric)} {scale * d['base_y']:.2f})\n\n"
        )
        lr: frontier.LiftResult = item["lift"]
        if scale != 100:
            # pass@1 stays in points; the diversity axis has its own unit.
            lr = frontier.LiftResult(**{**lr.__dict__, "x": 100 * lr.x})
        parts.append(frontier.lift_table(lr, scale=scale))
    return "".join(parts)


def sweep(
    config_path: Path, out: Path | None = None, *, use_cache: bool = True, progress: bool = True
) -> dict[str, Any]:
    """Run (or load from the cache) a sweep, then write `results.json`, `frontier.png`, `lifts.md`.

    Returns:
        ``{"out": Path, "cached": bool, "run_s": float, "doc": results.json's dict}``.

    Raises:
        ValueError: naming the file and key of a bad configuration.
    """
    cfg = load_config(config_path)
    out = Path(out) if out is not None else Path("runs/toy_sweep") / Path(config_path).stem
    cache = out / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    _enable_jax_cache(cache / "jax")
    path = cache / f"sweep-{code_hash()}-{cfg.digest()}.npz"
    start = time.perf_counter()
    if use_cache and path.exists():
        with np.load(path) as data:
            res: dict[str, Any] = {k: data[k] for k in data.files}
        rows = all_rows(cfg)
        res["rows"] = [rows[int(i)] for i in res["row_order"]]
        cached = True
    else:
        res = run_sweep(cfg, progress=progress)
        store.save_npz(path, {k: v for k, v in res.items() if k != "rows"})
        cached = False
    run_s = time.perf_counter() - start
    analysis = analyse(cfg, res)
    doc = results_doc(cfg, res, analysis)
    store.write_text(out / "results.json", json.dumps(doc, indent=1) + "\n")
    store.write_text(out / "lifts.md", lifts_markdown(cfg, analysis))
    plot_frontier(cfg, analysis, out / "frontier.png")
    return {"out": out, "cached": cached, "run_s": run_s, "doc": doc}
