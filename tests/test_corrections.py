"""The correction algebra (runner/core/corrections.py, and the filters of runner/core/masking.py): what every
preset computes, pinned by numbers derived outside the code.

- Golden values for every preset on hand-made padded inputs (two cases per preset, plus
  asymmetric bands where the convention matters). The numbers were derived from the spec's formulas
  by tests/helpers/naive_corrections.py, a naive scalar restatement of the preset table, and are pinned here: the
  test checks the implementation against the pinned numbers and the reference against them too.
- Every preset reproduces every number of the spec's worked cases (shared/spec/cases), to 1e-5:
  the bug report's three cases and the frameworks' released-code cases, NaN/−inf included.
- The edges that the golden cases never reach, each pinned by a number derived by hand below:
  closed band ends (in ratio and in log space), the veto, the geometric weight, the ±20 bound on the
  weight's log-ratio, the detached coefficient of a bypass correction, the validation of a
  correction's fields, and the shuffled filter (a control). Each was written against a planted bug
  that the rest of the suite let through (issue 20): `<=` turned into `<` at a band end, the
  coefficient left attached to lp. The mutant's number is given beside the true one where it helps.

The loss's own edges (PPO's ratio bound, asymmetric clipping) are in tests/test_boundaries.py and
tests/test_losses_edges.py; the metrics of a correction in tests/test_metrics.py.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import pytest
import torch
import yaml

from runner import registry
from runner.audit.case_files import load_case_file
from runner.audit.case_study import compare, evaluate
from runner.core.corrections import Correction, apply_correction
from runner.core.losses import LossSpec, policy_loss
from runner.errors import UserError
from runner.hydra_app import app as hydra_app
from tests.helpers.naive_corrections import ppo_token_mean
from tests.helpers.repo import spec_case_file

pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors: see conftest.py

GOLDEN = [
    (
        "none",
        None,
        None,
        "padded-mixed",
        -0.3612356,
        [[-0.2210342, -0.1809675, -0.2210342, 0.0], [0.1146223, 0.147178, 0.0, 0.0]],
    ),
    (
        "none",
        None,
        None,
        "short-and-empty-rows",
        -0.0654475,
        [[0.0, -0.125, -0.0758163], [0.2853688, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "tis",
        0.5,
        5.0,
        "padded-mixed",
        -1.2760532,
        [[-1.1051709, -0.134064, -0.2442806, 0.0], [0.0573112, 0.1501511, 0.0, 0.0]],
    ),
    (
        "tis",
        0.5,
        5.0,
        "short-and-empty-rows",
        0.194644,
        [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    ("icepop", 0.5, 5.0, "padded-mixed", -0.2281934, [[-0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]]),
    (
        "icepop",
        0.5,
        5.0,
        "short-and-empty-rows",
        0.194644,
        [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "seq-mask-tis",
        0.5,
        5.0,
        "padded-mixed",
        -1.2760532,
        [[-1.1051709, -0.134064, -0.2442806, 0.0], [0.0573112, 0.1501511, 0.0, 0.0]],
    ),
    (
        "seq-mask-tis",
        0.5,
        5.0,
        "short-and-empty-rows",
        0.194644,
        [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "seq-tis",
        None,
        5.0,
        "padded-mixed",
        -3.0262731,
        [[-1.1051709, -0.9048374, -1.1051709, 0.0], [0.0389252, 0.049981, 0.0, 0.0]],
    ),
    (
        "seq-tis",
        None,
        5.0,
        "short-and-empty-rows",
        0.1670718,
        [[0.0, -0.1452293, -0.088086], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    ("seq-mis", 0.5, 2.0, "padded-mixed", 0.0, [[-0.0, -0.0, -0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    (
        "seq-mis",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.4075904,
        [[0.0, -0.1452293, -0.088086], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    ("geo-mask", 0.999, 1.001, "padded-mixed", 0.0, [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    ("geo-mask", 0.999, 1.001, "short-and-empty-rows", 0.0, [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    (
        "openrlhf-bc71bb1/tis",
        0.5,
        5.0,
        "padded-mixed",
        -1.2760532,
        [[-1.1051709, -0.134064, -0.2442806, 0.0], [0.0573112, 0.1501511, 0.0, 0.0]],
    ),
    (
        "openrlhf-bc71bb1/tis",
        0.5,
        5.0,
        "short-and-empty-rows",
        0.194644,
        [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "openrlhf-bc71bb1/icepop",
        0.5,
        5.0,
        "padded-mixed",
        -0.2281934,
        [[-0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]],
    ),
    (
        "openrlhf-bc71bb1/icepop",
        0.5,
        5.0,
        "short-and-empty-rows",
        0.194644,
        [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "openrlhf-bc71bb1/seq-mask-tis",
        0.5,
        5.0,
        "padded-mixed",
        -1.6678502,
        [[-1.4778112, -0.134064, -0.2442806, 0.0], [0.0381545, 0.1501511, 0.0, 0.0]],
    ),
    (
        "openrlhf-bc71bb1/seq-mask-tis",
        0.5,
        5.0,
        "short-and-empty-rows",
        0.194644,
        [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "openrlhf-0.11/token-clip",
        0.5,
        5.0,
        "padded-mixed",
        -1.2760532,
        [[-1.1051709, -0.134064, -0.2442806, 0.0], [0.0573112, 0.1501511, 0.0, 0.0]],
    ),
    (
        "openrlhf-0.11/token-clip",
        0.5,
        5.0,
        "short-and-empty-rows",
        0.194644,
        [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "openrlhf-0.11/token-mask",
        0.5,
        5.0,
        "padded-mixed",
        -0.2281934,
        [[-0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]],
    ),
    (
        "openrlhf-0.11/token-mask",
        0.5,
        5.0,
        "short-and-empty-rows",
        0.194644,
        [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "openrlhf-0.11/seq-mask",
        0.5,
        5.0,
        "padded-mixed",
        -1.6678502,
        [[-1.4778112, -0.134064, -0.2442806, 0.0], [0.0381545, 0.1501511, 0.0, 0.0]],
    ),
    (
        "openrlhf-0.11/seq-mask",
        0.5,
        5.0,
        "short-and-empty-rows",
        0.194644,
        [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "trl/token-truncate",
        None,
        3.0,
        "padded-mixed",
        -0.8531415,
        [[-0.6631026, -0.134064, -0.2442806, 0.0], [0.0381545, 0.1501511, 0.0, 0.0]],
    ),
    (
        "trl/token-truncate",
        None,
        3.0,
        "short-and-empty-rows",
        0.194644,
        [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "trl/token-mask",
        None,
        3.0,
        "padded-mixed",
        -0.190039,
        [[-0.0, -0.134064, -0.2442806, 0.0], [0.0381545, 0.1501511, 0.0, 0.0]],
    ),
    (
        "trl/token-mask",
        None,
        3.0,
        "short-and-empty-rows",
        0.194644,
        [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "trl/sequence-truncate",
        None,
        3.0,
        "padded-mixed",
        -1.7802014,
        [[-0.6631026, -0.5429025, -0.6631026, 0.0], [0.0389252, 0.049981, 0.0, 0.0]],
    ),
    (
        "trl/sequence-truncate",
        None,
        3.0,
        "short-and-empty-rows",
        0.1670718,
        [[0.0, -0.1452293, -0.088086], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "trl/sequence-mask",
        None,
        3.0,
        "padded-mixed",
        0.0889062,
        [[-0.0, -0.0, -0.0, 0.0], [0.0389252, 0.049981, 0.0, 0.0]],
    ),
    (
        "trl/sequence-mask",
        None,
        3.0,
        "short-and-empty-rows",
        0.1670718,
        [[0.0, -0.1452293, -0.088086], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "verl/token-tis",
        None,
        2.0,
        "padded-mixed",
        -0.6321073,
        [[-0.4420684, -0.134064, -0.2442806, 0.0], [0.0381545, 0.1501511, 0.0, 0.0]],
    ),
    (
        "verl/token-tis",
        None,
        2.0,
        "short-and-empty-rows",
        0.1907194,
        [[0.0, -0.1687324, -0.0686015], [0.5707377, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "verl/seq-tis",
        None,
        2.0,
        "padded-mixed",
        -1.1571655,
        [[-0.4420684, -0.361935, -0.4420684, 0.0], [0.0389252, 0.049981, 0.0, 0.0]],
    ),
    (
        "verl/seq-tis",
        None,
        2.0,
        "short-and-empty-rows",
        0.1631472,
        [[0.0, -0.1452293, -0.088086], [0.5707377, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "verl/icepop",
        0.5,
        5.0,
        "padded-mixed",
        -0.2281934,
        [[-0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]],
    ),
    (
        "verl/icepop",
        0.5,
        5.0,
        "short-and-empty-rows",
        0.194644,
        [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    ("verl/geo-rs", 0.999, 1.001, "padded-mixed", 0.0, [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    ("verl/geo-rs", 0.999, 1.001, "short-and-empty-rows", 0.0, [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ("verl/seq-mis", 0.5, 2.0, "padded-mixed", 0.0, [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    (
        "verl/seq-mis",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.5434539,
        [[0.0, -0.193639, -0.117448], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "geo-mask",
        0.9,
        1.8,
        "padded-mixed",
        -1.0383931,
        [[-0.3683903, -0.3016125, -0.3683903, 0.0], [0.0, 0.0, 0.0, 0.0]],
    ),
    (
        "geo-mask",
        0.9,
        1.8,
        "short-and-empty-rows",
        -0.4677551,
        [[0.0, -0.1666667, -0.1010884], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    ("verl/geo-rs", 0.9, 1.8, "padded-mixed", 0.6545006, [[0.0, 0.0, 0.0, 0.0], [0.2865558, 0.3679449, 0.0, 0.0]]),
    (
        "verl/geo-rs",
        0.9,
        1.8,
        "short-and-empty-rows",
        -0.4677551,
        [[0.0, -0.1666667, -0.1010884], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "trl/token-mask",
        0.5,
        3.0,
        "padded-mixed",
        -0.2281934,
        [[-0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]],
    ),
    (
        "trl/token-mask",
        0.5,
        3.0,
        "short-and-empty-rows",
        0.194644,
        [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    ("verl/seq-mis", 0.5, 3.0, "padded-mixed", 0.2222655, [[0.0, 0.0, 0.0, 0.0], [0.0973131, 0.1249524, 0.0, 0.0]]),
    (
        "verl/seq-mis",
        0.5,
        3.0,
        "short-and-empty-rows",
        -0.5434539,
        [[0.0, -0.193639, -0.117448], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    # NeMo-RL and AReaL: their non-finite handling changes nothing on these finite cases; conf/cases/nemo-rl.yaml
    # and conf/cases/areal.yaml have the rest
    (
        "skyrl/tis-token",
        None,
        2.0,
        "padded-mixed",
        -0.6321074,
        [[-0.4420684, -0.134064, -0.2442806, 0.0], [0.0381544, 0.1501511, 0.0, 0.0]],
    ),
    (
        "skyrl/tis-token",
        None,
        2.0,
        "short-and-empty-rows",
        0.1907195,
        [[0.0, -0.1687323, -0.0686015], [0.5707377, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "skyrl/tis-sequence",
        None,
        5.0,
        "padded-mixed",
        -3.0262733,
        [[-1.1051711, -0.9048374, -1.1051711, 0.0], [0.0389252, 0.049981, 0.0, 0.0]],
    ),
    (
        "skyrl/tis-sequence",
        None,
        5.0,
        "short-and-empty-rows",
        0.1670719,
        [[0.0, -0.1452293, -0.088086], [0.5746623, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "skyrl/token-mask-is",
        0.5,
        2.0,
        "padded-mixed",
        -0.2548237,
        [[0.0, -0.1809675, -0.2210342, 0.0], [0.0, 0.1471779, 0.0, 0.0]],
    ),
    (
        "skyrl/token-mask-is",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.3508163,
        [[0.0, -0.125, -0.0758163], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "areal/token-mask",
        0.5,
        5.0,
        "padded-mixed",
        -0.2281934,
        [[0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]],
    ),
    (
        "areal/token-mask",
        0.5,
        5.0,
        "short-and-empty-rows",
        0.1946441,
        [[0.0, -0.1687323, -0.0686015], [0.5746623, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "areal/token-clamp",
        None,
        5.0,
        "padded-mixed",
        -1.29521,
        [[-1.1051711, -0.134064, -0.2442806, 0.0], [0.0381544, 0.1501511, 0.0, 0.0]],
    ),
    (
        "areal/token-clamp",
        None,
        5.0,
        "short-and-empty-rows",
        0.1946441,
        [[0.0, -0.1687323, -0.0686015], [0.5746623, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "areal/sequence-mask",
        0.5,
        2.0,
        "padded-mixed",
        -0.9454641,
        [[-0.3895468, -0.318934, -0.3895468, 0.0], [0.0667959, 0.0857677, 0.0, 0.0]],
    ),
    (
        "areal/sequence-mask",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.3688031,
        [[0.0, -0.1314089, -0.0797035], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "areal/sequence-clamp",
        0.5,
        2.0,
        "padded-mixed",
        -0.9454641,
        [[-0.3895468, -0.318934, -0.3895468, 0.0], [0.0667959, 0.0857677, 0.0, 0.0]],
    ),
    (
        "areal/sequence-clamp",
        0.5,
        2.0,
        "short-and-empty-rows",
        0.2019346,
        [[0.0, -0.1314089, -0.0797035], [0.5707377, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    ("areal/sequence-mask-sum", 0.5, 2.0, "padded-mixed", 0.0, [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    (
        "areal/sequence-mask-sum",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.3688031,
        [[0.0, -0.1314089, -0.0797035], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "nemo-rl/tis",
        None,
        2.0,
        "padded-mixed",
        -0.6321074,
        [[-0.4420684, -0.134064, -0.2442806, 0.0], [0.0381544, 0.1501511, 0.0, 0.0]],
    ),
    (
        "nemo-rl/tis",
        None,
        2.0,
        "short-and-empty-rows",
        0.1907195,
        [[0.0, -0.1687323, -0.0686015], [0.5707377, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "nemo-rl/icepop",
        0.5,
        5.0,
        "padded-mixed",
        -0.2281934,
        [[0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]],
    ),
    (
        "nemo-rl/icepop",
        0.5,
        5.0,
        "short-and-empty-rows",
        0.1946441,
        [[0.0, -0.1687323, -0.0686015], [0.5746623, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "nemo-rl/seq-mask-tis",
        0.5,
        2.0,
        "padded-mixed",
        -1.6678507,
        [[-1.4778115, -0.134064, -0.2442806, 0.0], [0.0381544, 0.1501511, 0.0, 0.0]],
    ),
    (
        "nemo-rl/seq-mask-tis",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.3800182,
        [[0.0, -0.1687323, -0.0686015], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    # AReaL's KL statistics, agg=max and M2PO; SkyRL's sequence masks, outlier veto and token pre-mask
    (
        "areal/token-mask-kl_k1",
        0.0,
        1.0,
        "padded-mixed",
        -0.0941294,
        [[-0.0, -0.0, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]],
    ),
    (
        "areal/token-mask-kl_k1",
        0.0,
        1.0,
        "short-and-empty-rows",
        0.4059299,
        [[0.0, -0.1687324, -0.0], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "areal/token-mask-kl_k1",
        None,
        0.2,
        "padded-mixed",
        -0.190039,
        [[-0.0, -0.134064, -0.2442806, 0.0], [0.0381545, 0.1501511, 0.0, 0.0]],
    ),
    (
        "areal/token-mask-kl_k1",
        None,
        0.2,
        "short-and-empty-rows",
        -0.2112859,
        [[0.0, -0.0, -0.0686015], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "areal/token-mask-kl_k2",
        None,
        0.1,
        "padded-mixed",
        -0.2281934,
        [[-0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]],
    ),
    (
        "areal/token-mask-kl_k2",
        None,
        0.1,
        "short-and-empty-rows",
        -0.3800182,
        [[0.0, -0.1687324, -0.0686015], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "areal/token-mask-kl_k2",
        None,
        2.0,
        "padded-mixed",
        -1.6678502,
        [[-1.4778112, -0.134064, -0.2442806, 0.0], [0.0381545, 0.1501511, 0.0, 0.0]],
    ),
    (
        "areal/token-mask-kl_k2",
        None,
        2.0,
        "short-and-empty-rows",
        0.194644,
        [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "areal/token-mask-kl_k3",
        None,
        0.1,
        "padded-mixed",
        -0.2281934,
        [[-0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]],
    ),
    (
        "areal/token-mask-kl_k3",
        None,
        0.1,
        "short-and-empty-rows",
        -0.3800182,
        [[0.0, -0.1687324, -0.0686015], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "areal/token-mask-kl_k3",
        0.01,
        2.0,
        "padded-mixed",
        -1.5737208,
        [[-1.4778112, -0.134064, -0.0, 0.0], [0.0381545, 0.0, 0.0, 0.0]],
    ),
    (
        "areal/token-mask-kl_k3",
        0.01,
        2.0,
        "short-and-empty-rows",
        0.4059299,
        [[0.0, -0.1687324, -0.0], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "areal/sequence-mask-kl_k3",
        None,
        0.5,
        "padded-mixed",
        -1.6678502,
        [[-1.4778112, -0.134064, -0.2442806, 0.0], [0.0381545, 0.1501511, 0.0, 0.0]],
    ),
    (
        "areal/sequence-mask-kl_k3",
        None,
        0.5,
        "short-and-empty-rows",
        0.194644,
        [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    ("areal/sequence-mask-kl_k3", None, 0.02, "padded-mixed", 0.0, [[-0.0, -0.0, -0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    (
        "areal/sequence-mask-kl_k3",
        None,
        0.02,
        "short-and-empty-rows",
        -0.3800182,
        [[0.0, -0.1687324, -0.0686015], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "areal/sequence-mask-max",
        None,
        5.0,
        "padded-mixed",
        0.1525636,
        [[-0.0, -0.0, -0.0, 0.0], [0.0667959, 0.0857677, 0.0, 0.0]],
    ),
    (
        "areal/sequence-mask-max",
        None,
        5.0,
        "short-and-empty-rows",
        0.2058592,
        [[0.0, -0.1314089, -0.0797035], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "areal/sequence-mask-max",
        0.5,
        1.2,
        "padded-mixed",
        0.1525636,
        [[-0.0, -0.0, -0.0, 0.0], [0.0667959, 0.0857677, 0.0, 0.0]],
    ),
    (
        "areal/sequence-mask-max",
        0.5,
        1.2,
        "short-and-empty-rows",
        0.0,
        [[0.0, -0.0, -0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "areal/m2po",
        None,
        None,
        "padded-mixed",
        -0.4247062,
        [[0.0, -0.3016125, -0.3683903, 0.0], [0.0, 0.2452966, 0.0, 0.0]],
    ),
    (
        "areal/m2po",
        None,
        None,
        "short-and-empty-rows",
        -0.4677551,
        [[0.0, -0.1666667, -0.1010884], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    ("skyrl/geometric", 0.9, 1.1, "padded-mixed", 0.0, [[-0.0, -0.0, -0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    (
        "skyrl/geometric",
        0.9,
        1.1,
        "short-and-empty-rows",
        -0.3508163,
        [[0.0, -0.125, -0.0758163], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "skyrl/geometric",
        0.5,
        2.0,
        "padded-mixed",
        -0.3612356,
        [[-0.2210342, -0.1809675, -0.2210342, 0.0], [0.1146223, 0.147178, 0.0, 0.0]],
    ),
    (
        "skyrl/geometric",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.3508163,
        [[0.0, -0.125, -0.0758163], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    ("skyrl/product", 0.5, 2.0, "padded-mixed", 0.0, [[-0.0, -0.0, -0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    (
        "skyrl/product",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.3508163,
        [[0.0, -0.125, -0.0758163], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "skyrl/product",
        0.1,
        10.0,
        "padded-mixed",
        -0.3612356,
        [[-0.2210342, -0.1809675, -0.2210342, 0.0], [0.1146223, 0.147178, 0.0, 0.0]],
    ),
    (
        "skyrl/product",
        0.1,
        10.0,
        "short-and-empty-rows",
        -0.0654475,
        [[0.0, -0.125, -0.0758163], [0.2853688, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "skyrl/outlier-token-is",
        None,
        None,
        "padded-mixed",
        -0.3612356,
        [[-0.2210342, -0.1809675, -0.2210342, 0.0], [0.1146223, 0.147178, 0.0, 0.0]],
    ),
    (
        "skyrl/outlier-token-is",
        None,
        None,
        "short-and-empty-rows",
        -0.0654475,
        [[0.0, -0.125, -0.0758163], [0.2853688, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "skyrl/tis-sequence-token-mask-is",
        None,
        5.0,
        "padded-mixed",
        -0.17898,
        [[-0.0, -0.1481636, -0.1809675, 0.0], [0.0, 0.1501511, 0.0, 0.0]],
    ),
    (
        "skyrl/tis-sequence-token-mask-is",
        None,
        5.0,
        "short-and-empty-rows",
        -0.4075904,
        [[0.0, -0.1452293, -0.088086], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "skyrl/tis-sequence-token-mask-is",
        None,
        1.1,
        "padded-mixed",
        -0.17898,
        [[-0.0, -0.1481636, -0.1809675, 0.0], [0.0, 0.1501511, 0.0, 0.0]],
    ),
    (
        "skyrl/tis-sequence-token-mask-is",
        None,
        1.1,
        "short-and-empty-rows",
        -0.385898,
        [[0.0, -0.1375, -0.083398], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "skyrl/geometric-token-mask-is",
        0.9,
        1.1,
        "padded-mixed",
        -0.2548237,
        [[-0.0, -0.1809675, -0.2210342, 0.0], [0.0, 0.147178, 0.0, 0.0]],
    ),
    (
        "skyrl/geometric-token-mask-is",
        0.9,
        1.1,
        "short-and-empty-rows",
        -0.3508163,
        [[0.0, -0.125, -0.0758163], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "skyrl/geometric-token-mask-is",
        0.8,
        1.25,
        "padded-mixed",
        -0.2548237,
        [[-0.0, -0.1809675, -0.2210342, 0.0], [0.0, 0.147178, 0.0, 0.0]],
    ),
    (
        "skyrl/geometric-token-mask-is",
        0.8,
        1.25,
        "short-and-empty-rows",
        -0.3508163,
        [[0.0, -0.125, -0.0758163], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    # verl's seq_max rejection: k2 keeps padded-mixed's row 0 (max ½·1.9² = 1.805 ≤ 2), k3 drops it
    # (e^1.9 − 2.9 = 3.79); on short-and-empty-rows k3 drops row 1 (e^0.7 − 1.7 = 0.314 > 0.3), k2 keeps it (0.245)
    (
        "verl/seq-max-k2",
        None,
        2.0,
        "padded-mixed",
        -0.3612356,
        [[-0.2210342, -0.1809675, -0.2210342, 0.0], [0.1146223, 0.147178, 0.0, 0.0]],
    ),
    (
        "verl/seq-max-k2",
        None,
        0.3,
        "short-and-empty-rows",
        -0.06544751,
        [[0.0, -0.125, -0.07581633], [0.2853688, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    ("verl/seq-max-k3", None, 2.0, "padded-mixed", 0.6545006, [[0.0, 0.0, 0.0, 0.0], [0.2865558, 0.3679449, 0.0, 0.0]]),
    (
        "verl/seq-max-k3",
        None,
        0.3,
        "short-and-empty-rows",
        -0.4677551,
        [[0.0, -0.1666667, -0.1010884], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    # TRL's off-policy sequence mask (δ = 0.5) over sequence-mask: padded-mixed's row 1 has A = −0.7 and mean
    # roll − lp = 0.615 > 0.5, so it is dropped; short-and-empty-rows' negative row has mean −0.65 and stays
    (
        "trl/off-policy-mask",
        None,
        20.0,
        "padded-mixed",
        -3.410465,
        [[-1.209929, -0.9906065, -1.209929, 0.0], [0.0, 0.0, 0.0, 0.0]],
    ),
    (
        "trl/off-policy-mask",
        None,
        3.0,
        "short-and-empty-rows",
        0.1670718,
        [[0.0, -0.1452293, -0.08808601], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    # verl's batch-normalised TIS: the truncated weights over their batch mean (tokens, or non-empty sequences)
    (
        "verl/token-tis-batch-norm",
        None,
        2.0,
        "padded-mixed",
        -0.6079052,
        [[-0.4251425, -0.128931, -0.2349275, 0.0], [0.03669359, 0.1444022, 0.0, 0.0]],
    ),
    (
        "verl/token-tis-batch-norm",
        None,
        2.0,
        "short-and-empty-rows",
        0.1465403,
        [[0.0, -0.1296464, -0.05271028], [0.4385292, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "verl/seq-tis-batch-norm",
        None,
        2.0,
        "padded-mixed",
        -0.9892013,
        [[-0.3779015, -0.3093996, -0.3779015, 0.0], [0.03327517, 0.04272617, 0.0, 0.0]],
    ),
    (
        "verl/seq-tis-batch-norm",
        None,
        2.0,
        "short-and-empty-rows",
        0.1031978,
        [[0.0, -0.09186394, -0.0557183], [0.3610168, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    # ROLL and prime-rl: the naive restatement's numbers (these cases have no gap in a mask, so a segment is the
    # whole response; conf/cases/roll.yaml has the multi-segment case)
    (
        "roll/is-token",
        None,
        1.2,
        "padded-mixed",
        -0.45528,
        [[-0.265241, -0.134064, -0.2442806, 0.0], [0.0381545, 0.1501511, 0.0, 0.0]],
    ),
    (
        "roll/is-token",
        None,
        1.2,
        "short-and-empty-rows",
        -0.0188433,
        [[0.0, -0.15, -0.0686015], [0.3424426, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "roll/is-segment",
        None,
        1.2,
        "padded-mixed",
        -0.5950794,
        [[-0.265241, -0.217161, -0.265241, 0.0], [0.0667959, 0.0857677, 0.0, 0.0]],
    ),
    (
        "roll/is-segment",
        None,
        1.2,
        "short-and-empty-rows",
        -0.0263605,
        [[0.0, -0.1314089, -0.0797035], [0.3424426, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "roll/is-geometric",
        None,
        1.2,
        "padded-mixed",
        -0.5950794,
        [[-0.265241, -0.217161, -0.265241, 0.0], [0.0667959, 0.0857677, 0.0, 0.0]],
    ),
    (
        "roll/is-geometric",
        None,
        1.2,
        "short-and-empty-rows",
        -0.0263605,
        [[0.0, -0.1314089, -0.0797035], [0.3424426, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "roll/is-sequence",
        None,
        1.2,
        "padded-mixed",
        -0.6587368,
        [[-0.265241, -0.217161, -0.265241, 0.0], [0.0389252, 0.049981, 0.0, 0.0]],
    ),
    (
        "roll/is-sequence",
        None,
        1.2,
        "short-and-empty-rows",
        -0.0651478,
        [[0.0, -0.1452293, -0.088086], [0.3424426, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "roll/filter-token",
        0.5,
        2.0,
        "padded-mixed",
        -0.4247062,
        [[0.0, -0.3016125, -0.3683903, 0.0], [0.0, 0.2452966, 0.0, 0.0]],
    ),
    (
        "roll/filter-token",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.4677551,
        [[0.0, -0.1666667, -0.1010884], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "roll/filter-segment",
        0.5,
        2.0,
        "padded-mixed",
        -0.3612356,
        [[-0.2210342, -0.1809675, -0.2210342, 0.0], [0.1146223, 0.147178, 0.0, 0.0]],
    ),
    (
        "roll/filter-segment",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.4677551,
        [[0.0, -0.1666667, -0.1010884], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "roll/filter-geometric",
        0.5,
        2.0,
        "padded-mixed",
        -0.3612356,
        [[-0.2210342, -0.1809675, -0.2210342, 0.0], [0.1146223, 0.147178, 0.0, 0.0]],
    ),
    (
        "roll/filter-geometric",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.4677551,
        [[0.0, -0.1666667, -0.1010884], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    ("roll/filter-sequence", 0.5, 2.0, "padded-mixed", 0.0, [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    (
        "roll/filter-sequence",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.4677551,
        [[0.0, -0.1666667, -0.1010884], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "roll/diff-token",
        None,
        None,
        "padded-mixed",
        -0.4247062,
        [[0.0, -0.3016125, -0.3683903, 0.0], [0.0, 0.2452966, 0.0, 0.0]],
    ),
    (
        "roll/diff-token",
        None,
        None,
        "short-and-empty-rows",
        -0.4677551,
        [[0.0, -0.1666667, -0.1010884], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "roll/ratio-diff-segment",
        0.5,
        2.0,
        "padded-mixed",
        -1.0383931,
        [[-0.3683903, -0.3016125, -0.3683903, 0.0], [0.0, 0.0, 0.0, 0.0]],
    ),
    (
        "roll/ratio-diff-segment",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.4677551,
        [[0.0, -0.1666667, -0.1010884], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "prime-rl/default",
        None,
        None,
        "padded-mixed",
        -0.3612356,
        [[-0.2210342, -0.1809675, -0.2210342, 0.0], [0.1146223, 0.147178, 0.0, 0.0]],
    ),
    (
        "prime-rl/default",
        None,
        None,
        "short-and-empty-rows",
        -0.0654475,
        [[0.0, -0.125, -0.0758163], [0.2853688, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    # slime: its MIS helper's own cases are conf/cases/slime.yaml's
    (
        "slime/tis",
        0.0,
        2.0,
        "padded-mixed",
        -0.6321073,
        [[-0.4420684, -0.134064, -0.2442806, 0.0], [0.0381545, 0.1501511, 0.0, 0.0]],
    ),
    (
        "slime/tis",
        0.0,
        2.0,
        "short-and-empty-rows",
        0.1907194,
        [[0.0, -0.1687324, -0.0686015], [0.5707377, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "slime/icepop",
        0.5,
        2.0,
        "padded-mixed",
        -0.2281934,
        [[0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]],
    ),
    (
        "slime/icepop",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.3800182,
        [[0.0, -0.1687324, -0.0686015], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "slime/mis-truncate-token",
        None,
        2.0,
        "padded-mixed",
        -0.6321073,
        [[-0.4420684, -0.134064, -0.2442806, 0.0], [0.0381545, 0.1501511, 0.0, 0.0]],
    ),
    (
        "slime/mis-truncate-token",
        None,
        2.0,
        "short-and-empty-rows",
        0.1907194,
        [[0.0, -0.1687324, -0.0686015], [0.5707377, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "slime/mis-truncate-sequence",
        None,
        2.0,
        "padded-mixed",
        -1.1571655,
        [[-0.4420684, -0.361935, -0.4420684, 0.0], [0.0389252, 0.049981, 0.0, 0.0]],
    ),
    (
        "slime/mis-truncate-sequence",
        None,
        2.0,
        "short-and-empty-rows",
        0.1631472,
        [[0.0, -0.1452293, -0.088086], [0.5707377, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "slime/mis-truncate-geometric",
        None,
        1.25,
        "padded-mixed",
        -0.6262312,
        [[-0.2762927, -0.2262094, -0.2762927, 0.0], [0.0667959, 0.0857677, 0.0, 0.0]],
    ),
    (
        "slime/mis-truncate-geometric",
        None,
        1.25,
        "short-and-empty-rows",
        -0.012092,
        [[0.0, -0.1314089, -0.0797035], [0.356711, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "slime/mis-clip-token",
        0.5,
        2.0,
        "padded-mixed",
        -0.6129506,
        [[-0.4420684, -0.134064, -0.2442806, 0.0], [0.0573112, 0.1501511, 0.0, 0.0]],
    ),
    (
        "slime/mis-clip-token",
        0.5,
        2.0,
        "short-and-empty-rows",
        0.1907194,
        [[0.0, -0.1687324, -0.0686015], [0.5707377, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "slime/mis-clip-sequence",
        0.5,
        2.0,
        "padded-mixed",
        -1.1151716,
        [[-0.4420684, -0.361935, -0.4420684, 0.0], [0.0573112, 0.073589, 0.0, 0.0]],
    ),
    (
        "slime/mis-clip-sequence",
        0.5,
        2.0,
        "short-and-empty-rows",
        0.1631472,
        [[0.0, -0.1452293, -0.088086], [0.5707377, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "slime/mis-clip-geometric",
        0.8,
        1.25,
        "padded-mixed",
        -0.5693546,
        [[-0.2762927, -0.2262094, -0.2762927, 0.0], [0.0916978, 0.1177424, 0.0, 0.0]],
    ),
    (
        "slime/mis-clip-geometric",
        0.8,
        1.25,
        "short-and-empty-rows",
        -0.012092,
        [[0.0, -0.1314089, -0.0797035], [0.356711, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "slime/mis-mask-token",
        0.5,
        2.0,
        "padded-mixed",
        -0.2281934,
        [[0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]],
    ),
    (
        "slime/mis-mask-token",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.3800182,
        [[0.0, -0.1687324, -0.0686015], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    ("slime/mis-mask-sequence", 0.5, 2.0, "padded-mixed", 0.0, [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    (
        "slime/mis-mask-sequence",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.4075904,
        [[0.0, -0.1452293, -0.088086], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    ("slime/mis-mask-geometric", 0.8, 1.25, "padded-mixed", 0.0, [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    (
        "slime/mis-mask-geometric",
        0.8,
        1.25,
        "short-and-empty-rows",
        -0.3688031,
        [[0.0, -0.1314089, -0.0797035], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "slime/mis-rs-veto",
        0.5,
        2.0,
        "padded-mixed",
        -0.2281934,
        [[0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]],
    ),
    (
        "slime/mis-rs-veto",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.3800182,
        [[0.0, -0.1687324, -0.0686015], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "slime/mis-batch-normalize",
        0.5,
        2.0,
        "padded-mixed",
        -0.2194564,
        [[0.0, -0.128931, -0.2349275, 0.0], [0.0, 0.1444022, 0.0, 0.0]],
    ),
    (
        "slime/mis-batch-normalize",
        0.5,
        2.0,
        "short-and-empty-rows",
        -0.291989,
        [[0.0, -0.1296464, -0.0527103], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
    (
        "slime/opsm",
        None,
        None,
        "padded-mixed",
        -0.6230359,
        [[-0.2210342, -0.1809675, -0.2210342, 0.0], [0.0, 0.0, 0.0, 0.0]],
    ),
    (
        "slime/opsm",
        None,
        None,
        "short-and-empty-rows",
        -0.3508163,
        [[0.0, -0.125, -0.0758163], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    ),
]
CASES = {
    "padded-mixed": {
        "log_probs": [[-0.9, -1.6, -0.3, 7.0], [-2.2, -0.05, 3.0, -9.0]],
        "old_log_probs": [[-1.0, -1.5, -0.4, 2.0], [-2.0, -0.1, -1.0, 4.0]],
        "rollout_log_probs": [[-2.9, -1.2, -0.5, -6.0], [-0.9, -0.12, 5.0, -3.0]],
        "advantages": [[1.0, 1.0, 1.0, 1.0], [-0.7, -0.7, -0.7, -0.7]],
        "action_mask": [[1, 1, 1, 0], [1, 1, 0, 0]],
    },
    "short-and-empty-rows": {
        "log_probs": [[-0.1, -1.0, -2.5], [-0.25, 5.0, 0.0], [2.0, 2.0, 2.0]],
        "old_log_probs": [[-0.5, -1.0, -2.0], [-0.2, -0.3, -0.4], [-1.0, -1.0, -1.0]],
        "rollout_log_probs": [[-0.45, -1.3, -1.9], [-0.9, -0.3, -0.4], [-1.0, -1.0, -1.0]],
        "advantages": [[0.5, 0.5, 0.5], [-1.2, -1.2, -1.2], [1.0, 1.0, 1.0]],
        "action_mask": [[1, 1, 1], [1, 0, 0], [0, 0, 0]],
    },
}


@functools.cache
def _composed(name: str) -> Correction:
    """The preset as conf/ defines it, composed once per process (a Correction is frozen)."""
    return Correction.from_config(hydra_app.to_container(hydra_app.compose([f"correction={name}"]).correction))


def _preset(name, low, high) -> Correction:
    return _composed(name).with_band(low, high)


def _tensors(case):
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in case.items()}


@pytest.mark.parametrize(
    "preset,low,high,case_name,loss,grad", GOLDEN, ids=[f"{g[0]}[{g[1]},{g[2]}]:{g[3]}" for g in GOLDEN]
)
def test_golden(preset, low, high, case_name, loss, grad):
    t = _tensors(CASES[case_name])
    lp = t["log_probs"].clone().requires_grad_(True)
    out = policy_loss(
        LossSpec(),
        _preset(preset, low, high),
        lp,
        t["old_log_probs"],
        t["rollout_log_probs"],
        t["advantages"],
        t["action_mask"],
    )
    out.loss.backward()
    assert out.loss.item() == pytest.approx(loss, abs=1e-5)
    assert torch.allclose(lp.grad, torch.tensor(grad), atol=1e-5)
    # the reference restatement agrees with the pinned numbers (it is what derived them)
    ref_loss, ref_grad = ppo_token_mean(preset, CASES[case_name], low, high)
    assert ref_loss == pytest.approx(loss, abs=1e-6)
    assert torch.allclose(torch.tensor(ref_grad), torch.tensor(grad), atol=1e-6)


def test_golden_covers_every_preset():
    from runner import registry

    assert {g[0] for g in GOLDEN} == {e.name for e in registry.presets()}
    per_preset = {}
    for g in GOLDEN:
        per_preset[g[0]] = per_preset.get(g[0], 0) + 1
    assert min(per_preset.values()) >= 2


def test_padding_values_cannot_leak_into_our_presets():
    """NaN and inf at masked positions change nothing for our presets (they are sanitised first)."""
    t = _tensors(CASES["padded-mixed"])
    poisoned = {k: v.clone() for k, v in t.items()}
    pad = t["action_mask"] == 0
    for key, value in (
        ("log_probs", float("nan")),
        ("old_log_probs", float("inf")),
        ("rollout_log_probs", float("-inf")),
        ("advantages", float("nan")),
    ):
        poisoned[key][pad] = value
    for name in ("tis", "icepop", "seq-mask-tis", "seq-tis", "seq-mis", "geo-mask"):
        corr = _preset(
            name, *{"seq-tis": (None, 5.0), "seq-mis": (0.5, 2.0), "geo-mask": (0.9, 1.8)}.get(name, (0.5, 5.0))
        )
        grads = []
        losses = []
        for tens in (t, poisoned):
            lp = tens["log_probs"].clone().requires_grad_(True)
            out = policy_loss(
                LossSpec(),
                corr,
                lp,
                tens["old_log_probs"],
                tens["rollout_log_probs"],
                tens["advantages"],
                tens["action_mask"],
            )
            out.loss.backward()
            losses.append(out.loss.item())
            grads.append(lp.grad)
        assert losses[0] == pytest.approx(losses[1], abs=0), name
        assert torch.equal(grads[0], grads[1]), name


def test_faithful_padding_multiplies_like_released_code():
    """OpenRLHF's masked mean multiplies by the mask: NaN padding leaks into the loss."""
    t = _tensors(CASES["padded-mixed"])
    t["log_probs"][t["action_mask"] == 0] = float("nan")
    out = policy_loss(
        LossSpec(),
        _preset("openrlhf-0.11/token-clip", 0.5, 5.0),
        t["log_probs"],
        t["old_log_probs"],
        t["rollout_log_probs"],
        t["advantages"],
        t["action_mask"],
    )
    assert torch.isnan(out.loss)


def test_veto_rejects_whole_sequence():
    t = _tensors(CASES["padded-mixed"])  # sequence 2 has ρ_t = e^-1.1 ≈ 0.333 on its first token
    corr = _preset("tis", 0.5, 5.0)
    from dataclasses import replace

    vetoed = replace(corr, veto=0.4)
    res = apply_correction(vetoed, t["old_log_probs"], t["rollout_log_probs"], t["action_mask"])
    assert res.coef[1].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert res.coef[0, :3].tolist() == pytest.approx([5.0, 0.7408182, 1.1051709], abs=1e-6)
    assert res.metrics["seq_masked_fraction"] == pytest.approx(0.5)


# ----------------------------------------------------------------------------------------- the spec's worked cases
def _entries():
    for name in ("seed-issue", "frameworks"):
        path = spec_case_file(name)
        data = yaml.safe_load(path.read_text())
        for entry in data["expect"]:
            yield pytest.param(path, entry, id=f"{name}:{entry['preset']}")


@pytest.mark.parametrize("path,entry", list(_entries()))
def test_preset_reproduces_spec_numbers(path, entry):
    cfg = hydra_app.compose([f"correction={entry['preset']}", *entry.get("overrides", [])])
    corr = Correction.from_config(hydra_app.to_container(cfg.correction))
    spec = LossSpec.from_config(hydra_app.to_container(cfg.loss))
    case_file = load_case_file(path)
    results = [evaluate(c, spec, corr) for c in case_file.cases]
    assert compare(results, entry["results"]) == []
    # finite is exactly "loss and grad finite"
    for res, exp in zip(results, entry["results"]):
        loss = float(exp["loss"])
        assert res["finite"] == (
            math.isfinite(loss) and all(math.isfinite(float(v)) for row in exp.get("grad", [[0.0]]) for v in row)
        )


def test_seed_bug_numbers_side_by_side():
    """The headline of the bug report: as shipped −inf / NaN, fixed 0 with zero gradient."""
    case_file = load_case_file(spec_case_file("seed-issue"))
    spec = LossSpec()
    shipped = Correction.from_config(
        hydra_app.to_container(hydra_app.compose(["correction=openrlhf-bc71bb1/seq-mask-tis"]).correction)
    )
    fixed = Correction.from_config(hydra_app.to_container(hydra_app.compose(["correction=seq-mask-tis"]).correction))
    accepted, rejected = case_file.cases[1], case_file.cases[2]
    assert evaluate(accepted, spec, shipped)["loss"] == "-inf"
    assert evaluate(rejected, spec, shipped)["loss"] == "nan"
    assert evaluate(accepted, spec, fixed)["loss"] == pytest.approx(-2.75)
    assert evaluate(rejected, spec, fixed)["loss"] == 0.0
    assert evaluate(rejected, spec, fixed)["grad"] == [[0.0, 0.0]]


# ----------------------------------------------------------------------------------------- band edges, the veto, the weights
def _filtering_presets() -> list[str]:
    """Every preset that rejects units by a band on a log-ratio statistic: token, sequence and geometric
    filters, compared in ratio space (ours, OpenRLHF, TRL) and in log space (verl, whose geo-rs also inverts
    the statistic). AReaL's KL statistics are 0, not 1, on policy: their edges are tested below."""
    return [
        e.name
        for e in registry.presets()
        if _composed(e.name).filter != "none"
        and _composed(e.name).filter_metric == "log-ratio"
        and _composed(e.name).band_space != "value"  # divergences: below
    ]


FILTERING = _filtering_presets()


def test_the_band_edges_cover_every_level_and_both_spaces():
    corrs = [_preset(name, 0.5, 2.0) for name in FILTERING]
    assert {c.filter for c in corrs} == {"token", "sequence", "geometric", "max", "segment"}
    assert {c.band_space for c in corrs} == {"ratio", "log"}
    assert any(c.filter_inverted for c in corrs)


# ρ = 1 exactly on every token (old = roll), so every statistic sits exactly at 1 (log 0).
ON_POLICY = torch.tensor([[-0.7, -1.3, -2.0], [-0.2, -3.0, -0.9]])
FULL = torch.ones(2, 3)


@pytest.mark.parametrize(
    "band", [(0.5, 1.0), (1.0, 2.0), (None, 1.0), (1.0, None)], ids=["high-edge", "low-edge", "high-only", "low-only"]
)
@pytest.mark.parametrize("name", FILTERING)
def test_a_statistic_exactly_on_a_band_edge_is_kept(name, band):
    """Bands are closed: ρ = 1 in [0.5, 1.0] or [1.0, 2.0] keeps every unit with coefficient 1.0
    (a `<` in place of `<=` rejects them all); verl's log-space band compares log ρ = 0 with log 1 = 0."""
    res = apply_correction(_preset(name, *band), ON_POLICY, ON_POLICY, FULL)
    assert res.keep.all(), name
    assert res.coef.tolist() == [[1.0] * 3] * 2, name
    assert torch.equal(res.mask, FULL)
    assert res.metrics["token_masked_fraction"] == 0.0 and res.metrics["seq_masked_fraction"] == 0.0


@pytest.mark.parametrize("band", [(0.5, 0.999), (1.001, 2.0)], ids=["below-low", "above-high"])
@pytest.mark.parametrize("name", FILTERING)
def test_a_statistic_just_outside_the_band_is_rejected(name, band):
    """The counterpart of the edge test: a band that stops 0.001 short of ρ = 1 rejects every unit."""
    res = apply_correction(_preset(name, *band), ON_POLICY, ON_POLICY, FULL)
    assert not res.keep.any(), name
    assert res.coef.tolist() == [[0.0] * 3] * 2, name
    assert res.metrics["token_masked_fraction"] == 1.0 and res.metrics["seq_masked_fraction"] == 1.0


@pytest.mark.parametrize("name", FILTERING)
def test_a_zero_bound_is_a_ratio_of_zero_in_either_space(name):
    """low = 0 keeps every finite statistic and high = 0 rejects it: in log space the bound is
    log 0 = −∞, never math.log(0) (a domain error) nor +∞."""
    kept = apply_correction(_preset(name, 0.0, None), ON_POLICY, ON_POLICY, FULL)
    assert kept.coef.tolist() == [[1.0] * 3] * 2, name
    rejected = apply_correction(_preset(name, 0.0, 0.0), ON_POLICY, ON_POLICY, FULL)
    assert rejected.coef.tolist() == [[0.0] * 3] * 2, name


def test_each_framework_compares_in_its_own_space():
    """lr = 1e-9: ρ = exp(1e-9) rounds to exactly 1.0 in float32, so a ratio-space band [0.5, 1.0]
    (IcePop as OpenRLHF and TRL write it) keeps the token, while verl, which compares lr itself with
    log 1.0 = 0, rejects it. The two spaces agree everywhere except within rounding of a band end."""
    old, roll, one = torch.tensor([[1e-9]]), torch.tensor([[0.0]]), torch.ones(1, 1)
    assert torch.exp(old - roll).item() == 1.0
    for name in ("icepop", "openrlhf-0.11/token-mask", "trl/token-mask"):
        assert apply_correction(_preset(name, 0.5, 1.0), old, roll, one).coef.tolist() == [[1.0]], name
    assert apply_correction(_preset("verl/icepop", 0.5, 1.0), old, roll, one).coef.tolist() == [[0.0]]


def test_the_veto_threshold_is_strict():
    """veto v rejects a sequence with a token ρ_t < v: at ρ_t = 1 exactly, v = 1 keeps it, v = 1.001 does not."""
    tis = _preset("tis", 0.5, 5.0)
    from dataclasses import replace

    kept = apply_correction(replace(tis, veto=1.0), ON_POLICY, ON_POLICY, FULL)
    assert kept.coef.tolist() == [[1.0] * 3] * 2 and kept.metrics["seq_masked_fraction"] == 0.0
    vetoed = apply_correction(replace(tis, veto=1.001), ON_POLICY, ON_POLICY, FULL)
    assert vetoed.coef.tolist() == [[0.0] * 3] * 2 and vetoed.metrics["seq_masked_fraction"] == 1.0
    # v = 0 vetoes nothing (no ρ_t is below 0), and its threshold log 0 is −∞, not a domain error
    never = apply_correction(replace(tis, veto=0.0), ON_POLICY - 50.0, ON_POLICY, FULL)
    assert never.coef.tolist() == [[0.5] * 3] * 2 and never.metrics["seq_masked_fraction"] == 0.0


def test_the_veto_combines_with_a_filter_and_ignores_padding():
    """IcePop [0.5, 2] with veto 1e-3 (threshold ln 1e-3 = −6.9). Row 0: lr [0.1, 1.5, 0 | pad −10]: the
    filter drops ρ = e^1.5, nothing vetoes (the −10 is padding, which under `padding: multiply` keeps
    its lr): coef [e^0.1, 0, 1, 0]. Row 1: lr [0.1, 0, −10, 0]: vetoed, every token 0, though ρ = e^0.1
    and 1 pass the filter. A veto must not undo the filter's rejections, nor reject what it kept."""
    corr = Correction(
        name="icepop-veto", weight="token", filter="token", low=0.5, high=2.0, veto=1e-3, padding="multiply"
    )
    old = torch.tensor([[0.1, 1.5, 0.0, -10.0], [0.1, 0.0, -10.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    res = apply_correction(corr, old, torch.zeros(2, 4), mask)
    assert res.coef.tolist() == [[pytest.approx(math.exp(0.1), rel=1e-6), 0.0, 1.0, 0.0], [0.0] * 4]
    assert res.keep.tolist() == [[True, False, True, False], [False] * 4]  # the padded −10 is outside the band


def test_the_geometric_weight_no_preset_uses():
    """weight = geometric: ρ_geo = exp(G_i), G_i the mean masked-in lr, on every token of the
    sequence (0 at padding); with a log clamp c, exp(clamp(G_i, ±c)). lr = [0.3, −0.1 | pad] gives
    G = 0.1; lr = [25, 25] gives G = 25, clamped to 20."""
    old = torch.tensor([[0.3, -0.1, 0.0], [25.0, 25.0, 0.0]])
    roll = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    geo = Correction(name="geo-weight", weight="geometric", log_clamp=20.0)
    coef = apply_correction(geo, old, roll, mask).coef
    assert coef[0].tolist() == pytest.approx([math.exp(0.1), math.exp(0.1), 0.0], rel=1e-6)
    assert coef[1].tolist() == pytest.approx([math.exp(20), math.exp(20), 0.0], rel=1e-6)
    # a one-token sequence: G is its own lr (|y| = 1; a count floored at 2 would halve it), and an
    # empty one gets 0, not 0/0
    one = apply_correction(
        geo, torch.tensor([[0.4, 0.0], [0.0, 0.0]]), torch.zeros(2, 2), torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    ).coef
    assert one.tolist() == [[pytest.approx(math.exp(0.4), rel=1e-6), 0.0], [0.0, 0.0]]


def test_an_integer_or_bool_mask_is_taken_as_float():
    """The engine's mask is float32; a 0/1 integer or bool mask gives the same coefficients, metrics
    and a float32 result mask."""
    old = torch.tensor([[-1.0, -1.5, -0.4], [-2.0, -0.1, -1.0]])
    roll = torch.tensor([[-2.9, -1.2, -0.5], [-0.9, -0.12, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    corr = _preset("seq-mask-tis", 0.5, 5.0)
    ref = apply_correction(corr, old, roll, mask)
    for other in (mask.long(), mask.bool()):
        res = apply_correction(corr, old, roll, other)
        assert res.mask.dtype == torch.float32 and torch.equal(res.mask, ref.mask)
        assert torch.equal(res.coef, ref.coef) and res.metrics == ref.metrics


# ----------------------------------------------------------------------------------------- the ±20 weight clamp
LOG_CLAMPED = [
    "seq-tis",
    "seq-mis",
    "verl/token-tis",
    "verl/seq-tis",
    "verl/icepop",
    "verl/seq-mis",
    "skyrl/tis-token",
    "skyrl/tis-sequence",
    "skyrl/tis-sequence-token-mask-is",
    "slime/mis-truncate-token",
    "slime/mis-truncate-sequence",
    "slime/mis-truncate-geometric",
    "slime/mis-clip-token",
    "slime/mis-clip-sequence",
    "slime/mis-clip-geometric",
    "slime/mis-mask-token",
    "slime/mis-mask-sequence",
    "slime/mis-mask-geometric",
    "slime/mis-rs-veto",
    "slime/mis-batch-normalize",
]
LOG_CLAMPED_NORMALISED = ["verl/token-tis-batch-norm", "verl/seq-tis-batch-norm"]


def test_the_spec_names_the_log_clamped_presets():
    """The spec gives `log clamp 20` (or exp(clamp(·, ±20))) for exactly these presets."""
    clamped = {e.name for e in registry.presets() if _preset(e.name, None, None).log_clamp is not None}
    assert clamped == set(LOG_CLAMPED) | set(LOG_CLAMPED_NORMALISED)


@pytest.mark.parametrize("name", LOG_CLAMPED_NORMALISED)
def test_a_batch_normalised_weight_is_clamped_at_20_nats_before_the_mean(name):
    """lr = −25 and +25 as above: the weights e^∓20 over their mean (e^−20 + e^20)/2 are 2/(1 + e^40) and
    2/(1 + e^−40); unclamped, their ratio would be e^−50 instead of e^−40."""
    old = torch.tensor([[-30.0], [-5.0]])
    roll = torch.tensor([[-5.0], [-30.0]])
    coef = apply_correction(_preset(name, None, None), old, roll, torch.ones(2, 1)).coef.double()
    assert coef[1, 0].item() == pytest.approx(2.0, rel=1e-6)
    assert (coef[0, 0] / coef[1, 0]).item() == pytest.approx(math.exp(-40.0), rel=1e-5)


@pytest.mark.parametrize("name", LOG_CLAMPED)
def test_the_weight_log_ratio_is_clamped_at_20_nats(name):
    """One-token sequences with lr = −25 and +25, no band: the weight is e^∓20 = 2.0611536e-9 and
    4.8516520e8 (the unclamped e^∓25 would be 1.3887944e-11 and 7.2004899e10). Token and sequence
    weights agree here, as L_i = lr for a one-token sequence. A veto and a self-normalisation are lifted (they
    would reject lr = −25 and rescale the weights)."""
    old = torch.tensor([[-30.0], [-5.0]])
    roll = torch.tensor([[-5.0], [-30.0]])
    corr = replace(
        _preset(name, None, None), token_mask_low=None, token_mask_high=None, veto=None, self_normalize="none"
    )  # the weight alone
    res = apply_correction(corr, old, roll, torch.ones(2, 1))
    assert res.coef[0, 0].item() == pytest.approx(2.0611536e-9, rel=1e-6)
    assert res.coef[1, 0].item() == pytest.approx(4.8516520e8, rel=1e-6)


def test_verl_geo_rs_clamps_each_token_before_the_mean():
    """verl/geo-rs: statistic −mean_t clamp(lr_t, ±20). With lr = [−25, 0] it is −(−20 + 0)/2 = 10,
    so a band [e^9.9, e^10.1] keeps the sequence (unclamped, the statistic 12.5 would be rejected)."""
    old = torch.tensor([[-30.0, -1.0]])
    roll = torch.tensor([[-5.0, -1.0]])
    corr = _preset("verl/geo-rs", math.exp(9.9), math.exp(10.1))
    assert apply_correction(corr, old, roll, torch.ones(1, 2)).coef.tolist() == [[1.0, 1.0]]
    narrow = _preset("verl/geo-rs", math.exp(12.4), math.exp(12.6))
    assert apply_correction(narrow, old, roll, torch.ones(1, 2)).coef.tolist() == [[0.0, 0.0]]


# ----------------------------------------------------------------------------------------- bypass mode
def test_a_bypass_coefficient_is_detached_from_lp():
    """REINFORCE with bypass TIS: lr = lp − roll = 0.2 on both tokens, so ρ = e^0.2 inside [0.5, 5].
    Loss −ρ·A·mean(lp) = 1.5·e^0.2 = 1.8321; d loss / d lp_t = −ρ·A/2 = −0.6107 on each token. Were ρ
    attached, the product rule would add −ρ·lp_t/2, giving [0, +0.6107]."""
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    roll = torch.tensor([[-1.2, -2.2]])
    bypass_tis = Correction(name="bypass-tis", ratio="bypass", weight="token", weight_op="clamp", low=0.5, high=5.0)
    out = policy_loss(LossSpec(name="reinforce"), bypass_tis, lp, roll, roll, torch.ones(1, 2), torch.ones(1, 2))
    out.loss.backward()
    assert out.correction.coef.requires_grad is False
    assert out.correction.coef.tolist() == [pytest.approx([math.exp(0.2)] * 2, rel=1e-6)]
    assert out.loss.item() == pytest.approx(1.5 * math.exp(0.2), rel=1e-6)  # 1.8321
    assert lp.grad.tolist() == [pytest.approx([-math.exp(0.2) / 2] * 2, rel=1e-6)]  # −0.6107
    assert apply_correction(bypass_tis, roll, roll, torch.ones(1, 2), lp=lp).coef.requires_grad is False
    # the train study's one evaluation per step passes lp on too
    from runner.core.corrections import apply_correction_split

    (split,) = apply_correction_split(bypass_tis, roll, roll, torch.ones(1, 2), [slice(0, 1)], lp=lp)
    assert split.coef.tolist() == [pytest.approx([math.exp(0.2)] * 2, rel=1e-6)]


def test_correction_validation_checks_every_number_and_key():
    """Every numeric field is checked, also after one that is null (low null, high −1 is an error);
    an unknown key is a UserError naming it, not a TypeError; without a filter, keep is a bool
    all-True [B, T] (callers negate and combine it)."""
    for fields, needle in (
        ({"low": None, "high": -1.0}, "high must be non-negative"),
        ({"veto": math.nan}, "veto must be a number or null"),
        ({"low": "0.5"}, "low must be a number or null"),
        ({"high": True}, "high must be a number or null"),
        ({"log_clamp": None, "filter_log_clamp": -2.0}, "filter_log_clamp must be non-negative"),
        ({"low": 2.0, "high": 1.0}, r"low \(2.0\) > correction.high"),
    ):
        with pytest.raises(UserError, match=needle):
            Correction(name="x", weight="token", **fields).validate()
    with pytest.raises(UserError, match="unknown key.*nmae"):
        Correction.from_config({"name": "x", "nmae": "y"})
    keep = apply_correction(Correction(name="is", weight="token"), ON_POLICY, ON_POLICY, FULL).keep
    assert keep.dtype == torch.bool and keep.tolist() == [[True] * 3] * 2


# ----------------------------------------------------------------------------------------- the shuffled filter (a control)
def test_a_shuffled_filter_keeps_as_many_units_at_random():
    """shuffled_keep permutes keep's values over the live units: a sequence filter over the sequences with a
    masked-in token (an empty one keeps its value), a token filter over the masked-in tokens (padding keeps
    its value). Over 4000 draws each of the 5 live sequences is kept 2/5 of the time (binomial SE
    √(0.4·0.6/4000) = 0.0077; tolerance 4 SE = 0.031), where the filter itself always keeps the first two."""
    from runner.core.masking import shuffled_keep

    gen = torch.Generator().manual_seed(0)
    mask = torch.ones(6, 3)
    mask[5] = 0.0  # an empty sequence
    keep_seq = torch.tensor([[True], [True], [False], [False], [False], [True]])
    counts = torch.zeros(6)
    for _ in range(4000):
        out = shuffled_keep(keep_seq, mask, gen)
        assert out.shape == (6, 1) and int(out[:5].sum()) == 2 and bool(out[5])
        counts += out.squeeze(1).float()
    assert (counts[:5] / 4000).tolist() == pytest.approx([0.4] * 5, abs=0.031)
    tmask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    keep_tok = torch.tensor([[True, False, True], [False, False, True]])  # 2 of 5 live tokens kept; padding True
    for _ in range(50):
        out = shuffled_keep(keep_tok, tmask, gen)
        assert int(out[tmask > 0].sum()) == 2 and bool(out[0, 2])


def test_the_shuffled_geo_mask_rejects_as_much_as_geo_mask_but_not_the_same_sequences():
    """geo-mask's band [0.999, 1.001] on four sequences of G = [0, 0.01, 0, −0.02] keeps sequences 0 and 2
    (token_masked_fraction 0.5); shuffled, it keeps two of the four (the same 0.5), and over 200 draws not
    always 0 and 2 (that happens with probability 1/6 per draw). Without a random stream it is a one-line
    error, and a shuffle needs a filter."""
    roll = torch.zeros(4, 2)
    old = torch.tensor([[0.0, 0.0], [0.01, 0.01], [0.0, 0.0], [-0.02, -0.02]])
    mask = torch.ones(4, 2)
    geo = _composed("geo-mask")
    plain = apply_correction(geo, old, roll, mask)
    assert plain.keep[:, 0].tolist() == [True, False, True, False]
    assert plain.metrics["token_masked_fraction"] == 0.5
    shuffled = replace_fields(geo, filter_shuffle=True)
    gen = torch.Generator().manual_seed(1)
    picks = set()
    for _ in range(200):
        out = apply_correction(shuffled, old, roll, mask, generator=gen)
        assert out.metrics["token_masked_fraction"] == 0.5 and int(out.keep[:, 0].sum()) == 2
        picks.add(tuple(out.keep[:, 0].tolist()))
    assert len(picks) == 6  # all C(4, 2) pairs come up
    with pytest.raises(UserError, match="needs a random stream"):
        apply_correction(shuffled, old, roll, mask)
    with pytest.raises(UserError, match="needs a filter"):
        Correction(name="x", filter_shuffle=True).validate()
    with pytest.raises(UserError, match="true or false"):
        Correction(name="x", filter="token", filter_shuffle="yes").validate()


def replace_fields(corr: Correction, **fields) -> Correction:
    from dataclasses import replace

    out = replace(corr, **fields)
    out.validate()
    return out


def test_the_probe_refuses_a_shuffled_filter():
    """The probe's estimator re-derives each preset's coefficients and has no random stream: a shuffled filter
    there would silently be the plain one, so it is a one-line error."""
    from types import SimpleNamespace

    from runner.probe.estimator import plan

    shuffled = replace_fields(_composed("geo-mask"), filter_shuffle=True)
    with pytest.raises(UserError, match="filter_shuffle=true is a train-study control"):
        plan([SimpleNamespace(correction=shuffled)])
    assert len(plan([SimpleNamespace(correction=_composed("geo-mask"))])) == 1
