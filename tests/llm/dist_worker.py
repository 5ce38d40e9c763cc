"""One training step of a fixed global batch, for the multi-process equality test.

Run as ``python dist_worker.py MODEL OUT PARALLEL METHOD [PER_UPDATE [STEPS [MODE]]]`` (one process) or under
``torchrun --nproc_per_node 2`` (DDP or FSDP2 over gloo); ``dist_worker.py --each "ARGS" "ARGS" ...``
runs several such runs one after the other in one launch (one process group: a launch's
processes spend most of their time importing torch). The rollouts are scripted, a pure
function of the prompt text (half of each group the solver's correct answer, half random words,
fixed "sampler" log-probs), so every launch trains on the same global batch whatever rank samples
which prompt; the checkpoint written at step 1 is what the test compares.
"""

from __future__ import annotations

import os
import sys
import zlib

import numerics  # noqa: F401  (first: pins the numeric code paths before numpy, torch, JAX load)

# isort: split
import numpy as np
import torch

from llm.config import config_from_dict
from llm.data import load_train_problems
from llm.rollout.base import RolloutBatch, Sampling
from llm.run.distributed import close_distributed
from llm.tasks import TASKS, compact_completion, solve
from llm.train.trainer import train


class ScriptedBackend:
    """Deterministic responses per prompt (see the module docstring)."""

    def __init__(self, tokenizer, answers: dict[str, str]) -> None:
        self.tok = tokenizer
        self.answers = answers

    def sync_weights(self, model) -> None:
        pass

    def generate(self, prompts, group_size, *, sampling, generator=None, **_):
        tok = self.tok
        eos, pad = tok.eos_token_id, tok.pad_token_id
        enc = tok(prompts, padding=True, return_tensors="pt")
        responses = []
        for prompt in prompts:
            rng = np.random.default_rng(zlib.crc32(prompt.encode()))
            group = []
            for g in range(group_size):
                if g % 2 == 0:
                    ids = tok(self.answers[prompt], add_special_tokens=False)["input_ids"]
                else:
                    ids = rng.integers(4, tok.vocab_size, size=rng.integers(1, 6)).tolist()
                group.append([*ids[: sampling.max_new_tokens - 1], eos])
            responses.append(group)
        t = max(len(r) for group in responses for r in group)
        ids = torch.full((len(prompts), group_size, t), pad, dtype=torch.long)
        mask = torch.zeros(len(prompts), group_size, t)
        for b, group in enumerate(responses):
            for g, r in enumerate(group):
                ids[b, g, : len(r)] = torch.tensor(r)
                mask[b, g, : len(r)] = 1.0
        texts = [[tok.decode(r, skip_special_tokens=True) for r in group] for group in responses]
        return RolloutBatch(
            prompts=list(prompts),
            prompt_ids=enc["input_ids"],
            prompt_mask=enc["attention_mask"].float(),
            response_ids=ids,
            response_mask=mask,
            logp=torch.full(ids.shape, -1.5) * mask,
            texts=texts,
        )


def main(
    model: str,
    out: str,
    parallel: str,
    method: str,
    per_update: str = "0",
    steps: str = "1",
    mode: str = "run",
) -> None:
    """`mode`: run (all steps), kill (stop after step 1, checkpointed), resume (from it), or
    share (`generate_shared` with groups of 2 ranks, as vLLM tensor parallelism needs). A
    `method` ending in ``+kl`` turns on the KL controls: the in-loss and in-reward KL, both
    coefficients adaptive, and a reference reset after every step."""
    hyper = {"form": "token", "eta": 0.05} if method == "entropy_bonus" else {}
    kl: dict = {}
    if method.endswith("+kl"):
        method = method.removesuffix("+kl")
        kl = {
            "kl_coef": 0.01,
            "control": {"kl_in_reward": True, "kl_reward_coef": 0.05, "adaptive_kl": True,
                        "kl_target": 1e-3, "kl_horizon": 40, "reference_reset_every": 1},
        }  # fmt: skip
    cfg = config_from_dict(
        {
            **kl,
            "model_path": model,
            "method": method,
            "hyper": hyper,
            "steps": int(steps),
            "data": {"source": "generate", "n_problems": 8, "max_number": 9, "max_target": 30},
            "rollout": {
                "group_size": 4,
                "prompts_per_step": 4,
                "max_new_tokens": 12,
                "rollout_is_cap": 1.2,
            },
            "optim": {"prompts_per_update": int(per_update), "lr": 1e-3},
            # micro-batches of 3 straddle groups and ranks' row counts
            "system": {"micro_batch_size": 3, "num_threads": 1, "parallel": parallel},
            "run": {"save_every": 1, "tensorboard": False},
        }
    )
    problems = load_train_problems(cfg)
    answers = {
        TASKS[cfg.task].prompt(p, cfg.template): compact_completion(solve(p)[0]) for p in problems
    }
    if mode == "share":
        _share(model, out, answers)
        return
    train(
        cfg,
        out,
        backend_factory=lambda c, m, tok: ScriptedBackend(tok, answers),
        progress=False,
        stop_after=1 if mode == "kill" else None,
        resume=mode == "resume",
    )


def exit_launched_rank() -> None:
    """End a torchrun rank's script (this file's, `fsdp_worker`'s, `sharded_worker`'s) that got
    through its work: `close_distributed`, then leave without interpreter finalization
    (`os._exit`), where torch's gloo threads can still abort a process whose work is done (seen
    once in CI: rank 1 of the FSDP launch, after both runs were saved, "terminate called without
    an active exception"; pytorch/pytorch#179291). A rank that raised never gets here: its
    traceback and exit code stay torch's."""
    close_distributed()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class RecordingBackend(ScriptedBackend):
    """Records what `generate` was asked: the prompts and the generator's first draw."""

    def generate(self, prompts, group_size, *, generator=None, **kw):
        self.calls = getattr(self, "calls", [])
        self.calls.append((list(prompts), int(generator.initial_seed())))
        return super().generate(prompts, group_size, generator=generator, **kw)


def _share(model: str, out: str, answers: dict[str, str]) -> None:
    import json
    from pathlib import Path

    from llm.model.load import load_tokenizer
    from llm.run.distributed import generate_shared, init_distributed

    info = init_distributed("cpu")
    mine = sorted(answers)[2 * info.rank : 2 * info.rank + 2]
    backend = RecordingBackend(load_tokenizer(model), answers)
    roll = generate_shared(
        backend, mine, info, share=2, seed_of=lambda r: 1000 + r, group_size=3,
        sampling=Sampling(8),
    )  # fmt: skip
    record = {"mine": mine, "calls": backend.calls, "roll_prompts": roll.prompts,
              "rows": int(roll.response_ids.shape[0])}  # fmt: skip
    Path(out, f"rank{info.rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    if sys.argv[1] == "--each":
        for run in sys.argv[2:]:
            main(*run.split())
    else:
        main(*sys.argv[1:])
    exit_launched_rank()
