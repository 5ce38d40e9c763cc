"""Figure 7: solution multiplicity against the effect of global entropy control and DS-GRPO.

The shape of seed 000 Table 7: tasks with more distinct correct solutions per problem (solution
multiplicity 1.5, 3.7, 6.5, 15.7) gain more pass@8 from a global entropy bonus over GRPO
(−9.0, −6.0, +1.0, +3.4 points); the paper's principle is "bonus when multiplicity is high,
penalty when it is low", and DS-GRPO is meant to do well across.

What this toy cannot test. Table 7's principle is about within-prompt diversity: a prompt with
many correct solutions gains from a policy that spreads over them. Here a held-out prompt shares
nothing with training but the shared per-node component, and its pass@k is `1 − (1 − P(π))^k`:
it depends only on that prompt's own accuracy, not on how the mass is spread over its correct set,
so within-prompt diversity cannot raise it. High-multiplicity prompts are also the ones whose
correct sets overlap the popular (transferable) responses most, so they become easy after
training, whatever the method. The figure therefore measures how accuracy transfers by
multiplicity, not the principle; docs/toymdp.md says so next to it.

One run, prompts of every multiplicity: figure 6's toy dataset (`toymdp.experiments.passk`, where
the settings are documented) has 16 prompts for each `|C| ∈ {1, 2, 4, 8, 16}` (half held out),
every one with base correctness 0.05, so multiplicity varies while difficulty for the base policy
does not. All methods are trained in the same compiled program (`passk.train_all`, shared with
figure 6): GRPO, global entropy bonus (`A − η·ℓ`, η = 0.1), global entropy penalty (`A + η·ℓ`)
and DS-GRPO (γ_p, γ_n) = (0.1, 0.05). Metrics are grouped by the `|C|` of each prompt: exact
pass@1, pass@8 (Table 7's metric) and pass@64, each method minus GRPO, on held-out and on training
prompts; mean ± sd over training seeds.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from experiment.report import METHOD_COLORS
from toymdp.experiments import passk
from toymdp.experiments._plot import mean_and_spread, save
from toymdp.experiments._registry import register

FIG7_METHODS = ("grpo", "entropy_bonus", "entropy_penalty", "ds_grpo")
SHOWN_K = (1, 8, 64)


def run(quick: bool, seed: int) -> dict[str, np.ndarray]:
    """Results of figure 7 (GRPO, entropy bonus and penalty, DS-GRPO from `passk.train_all`)."""
    return passk.select_methods(passk.train_all(quick, seed), FIG7_METHODS)


def effect_vs_grpo(results: dict[str, np.ndarray], prompts: np.ndarray) -> np.ndarray:
    """pass@k of each method minus GRPO's, per multiplicity: `(S, R, len(MULTIPLICITIES), k)`.

    Raises:
        ValueError: if GRPO is not among `results["methods"]`.
    """
    names = list(results["methods"])
    if "grpo" not in names:
        raise ValueError("effect_vs_grpo: results hold no 'grpo' run")
    pk = results["pass_at_k"]  # (S, R, P, k)
    delta = pk - pk[names.index("grpo")][None]
    sizes = results["multiplicity"]
    return np.stack(
        [delta[:, :, prompts & (sizes == c)].mean(axis=2) for c in passk.MULTIPLICITIES], axis=2
    )


def absolute(results: dict[str, np.ndarray], prompts: np.ndarray) -> np.ndarray:
    """pass@k per multiplicity, `(S, R, len(MULTIPLICITIES), k)`."""
    sizes = results["multiplicity"]
    pk = results["pass_at_k"]
    return np.stack(
        [pk[:, :, prompts & (sizes == c)].mean(axis=2) for c in passk.MULTIPLICITIES], axis=2
    )


def _settings_text(results: dict[str, np.ndarray]) -> str:
    return (
        f"V={passk.NUM_ACTIONS}, H={passk.DEPTH} (64 responses); {results['multiplicity'].size} "
        f"prompts, |C| in {list(passk.MULTIPLICITIES)}, half held out; base correctness "
        f"{passk.BASE_CORRECTNESS} per prompt; shared + per-prompt policy; G={passk.GROUP_SIZE}, "
        f"U={int(results['num_updates'])}, Adam lr={passk.LEARNING_RATE}; DS (γp, γn)="
        f"({passk.GAMMA_P}, {passk.GAMMA_N}); mean ± sd over {int(results['num_seeds'])} seeds"
    )


def plot(results: dict[str, np.ndarray], out_dir: Path) -> list[Path]:
    """`fig7_multiplicity`: pass@{1, 8, 64} minus GRPO's against `|C|`; rows held-out, training."""
    ks = list(results["pass_k"])
    train = results["train_prompts"]
    sizes = np.asarray(passk.MULTIPLICITIES)
    fig, axes = plt.subplots(2, len(SHOWN_K), figsize=(11, 6.2), sharex=True)
    for row, (split, prompts) in enumerate((("held-out", ~train), ("training", train))):
        effect = 100 * effect_vs_grpo(results, prompts)
        grpo = 100 * absolute(results, prompts)[list(results["methods"]).index("grpo")]
        for col, k in enumerate(SHOWN_K):
            ax = axes[row, col]
            j = ks.index(k)
            for i, name in enumerate(results["methods"]):
                if name == "grpo":
                    continue
                mean, sd = mean_and_spread(effect[i, :, :, j])
                color = METHOD_COLORS[str(name)]
                # Small horizontal offsets keep the error bars of the methods apart.
                ax.errorbar(
                    sizes * 1.08 ** (i - 2), mean, yerr=sd, fmt="o-", ms=3, capsize=2, color=color,
                    label=passk.LABELS[str(name)],
                )  # fmt: skip
            ax.axhline(0.0, color=METHOD_COLORS["grpo"], lw=0.8, ls=":")
            ax.set_xscale("log", base=2)
            ax.set_xticks(sizes, [str(c) for c in sizes])
            grpo_level = ", ".join(f"{v:.0f}" for v in grpo[:, :, j].mean(axis=0))
            ax.set_title(
                f"{split}: pass@{k} − GRPO\n(GRPO's pass@{k}: {grpo_level} %)", fontsize=8.5
            )
            if row == 1:
                ax.set_xlabel("|C| (correct responses per prompt)")
            if col == 0:
                ax.set_ylabel("difference (percentage points)")
    axes[0, 0].legend(loc="best", fontsize=7.5)
    fig.suptitle(
        "Fig. 7 — solution multiplicity: entropy bonus, penalty and DS-GRPO relative to GRPO\n"
        "(not a test of seed 000's Table 7: a held-out prompt's pass@k depends only on its own "
        "accuracy, so within-prompt diversity cannot help)",
        fontsize=9.5,
    )
    text = (
        f"{_settings_text(results)}; entropy η={passk.ETA} (bonus A − ηℓ, penalty A + ηℓ); "
        f"{int((results['multiplicity'] == 1).sum() // 2)} training + as many held-out prompts "
        "per |C|"
    )
    fig.text(0.5, -0.04, text, ha="center", fontsize=7.5, wrap=True)
    fig.tight_layout()
    return save(fig, out_dir, "fig7_multiplicity")


def summary(results: dict[str, np.ndarray]) -> dict:
    """pass@{1, 8, 64} minus GRPO's (points) per `|C|`, per method, held-out and training."""
    ks = list(results["pass_k"])
    train = results["train_prompts"]
    out: dict = {"multiplicity": list(passk.MULTIPLICITIES)}
    for split, prompts in (("heldout", ~train), ("train", train)):
        effect = 100 * effect_vs_grpo(results, prompts)
        grpo = 100 * absolute(results, prompts)[list(results["methods"]).index("grpo")]
        for k in SHOWN_K:
            j = ks.index(k)
            out[f"{split}/grpo_pass@{k}"] = np.round(grpo[:, :, j].mean(axis=0), 2).tolist()
            for i, name in enumerate(results["methods"]):
                if name == "grpo":
                    continue
                mean, sd = mean_and_spread(effect[i, :, :, j])
                out[f"{split}/{name}_minus_grpo_pass@{k}"] = {
                    "mean": np.round(mean, 2).tolist(),
                    "sd": np.round(sd, 2).tolist(),
                }
    return out


register(
    "multiplicity",
    title="Solution multiplicity: entropy bonus, penalty and DS-GRPO vs GRPO on pass@k by |C|",
    order=7,
    run=run,
    plot=plot,
    summary=summary,
)
