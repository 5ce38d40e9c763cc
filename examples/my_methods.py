"""A shaping method defined outside the package and registered at import (docs/adding_a_method.md).

``python -m toymdp study --extend figures/toy_study_sharpening --methods examples/my_methods.toml
--import examples/my_methods.py`` trains it against the committed study's GRPO reference; the
package is not edited.
"""

from array_api_compat import array_namespace

from shaping import register
from shaping.core import grpo_advantages, is_correct, sequence_logp


@register("centred_ds", bounds={"beta": ">= 0", "eps": ">= 0"})
def centred_ds(batch, *, beta: float = 0.1, std_correction: int = 1, eps: float = 1e-6):
    """Centred likelihood penalty: ``A~ = A - beta c (l - mean_G l)`` on correct responses.

    ``A`` is GRPO's advantage, ``c`` the correct-set indicator and ``l = log pi_old(tau)`` the
    sequence log-prob; a correct response more likely than its group's average loses advantage,
    a rarer one gains it (DS-GRPO's positive term, centred within the group so that the group's
    mean correct advantage is unchanged when every response is correct).

    Shapes: ``rewards`` (B, G), ``logp_old``, ``mask`` (B, G, T) -> advantages (B, G).

    Hyper-parameters: ``beta`` >= 0 (0 is GRPO); ``std_correction``, ``eps`` as GRPO.

    Source: docs/adding_a_method.md (a worked example, not a paper's method).
    """
    r = batch["rewards"]
    xp = array_namespace(r)
    ell = sequence_logp(batch["logp_old"], batch["mask"])  # (B, G)
    c = xp.astype(is_correct(r), r.dtype)  # (B, G)
    a = grpo_advantages(r, std_correction=std_correction, eps=eps)
    return a - beta * c * (ell - xp.mean(ell, axis=-1, keepdims=True))
