"""`task=count-in-text`: count-asked for a language model. The prompt asks for k target words in a text of
`rollout.seq_len` words; the model writes the text token by token, seeing what it wrote so far. The task
brings its own vocabulary and a corpus for the warm start, so `policy=transformer` can run it at any length.

Vocabulary (`vocab_size` = `task.words` + len(k) + 2):

    0 … words−1              the words (`task.targets` are some of them)
    words                    BOS (starts every prompt)
    words + 1 … words + X    ASK_i: prompt i asks for k[i] target words (X = len(k) prompts)
    words + X + 1            EOS (ends a response early; the corpus never writes it)

A prompt is BOS ASK_i with i uniform. R = 1 if the response (up to its EOS, if any) holds k[i] target
words give or take `task.tolerance`, else 0: a verifiable 0/1 reward over a spread of difficulties.

The corpus (`teacher`, what SFT imitates) is a sparse Markov chain over the words, fixed by
`task.corpus_seed`: each word has `task.successors` possible next words, in a random order, with
probabilities ∝ rank^−`task.zipf` (a head and a tail: with 8 successors and exponent 2.5, 0.87 nats per
word and 10% of the probability mass below p = 0.1, the "forking tokens" of a pretrained model). The
corpus has read the question: for ASK_i it tilts the chain towards or away from the target words
(every transition into a target ×λ_i, renormalised) so that its expected count lies `task.corpus_follows`
of the way from the chain's own (T × its stationary share of targets) to k[i]. With 1 (the default) the
warm start answers every ask right on average, with the chain's spread (a standard deviation of about 4
at T = 256), so about 45% of its responses land within ±2: it understands the question and cannot count,
as a pretrained model is before RL. RL must learn to count. (With 0.5, a weaker tilt, 800 SFT steps
did not learn to read the question at all: every ask got the chain's own count.)
SFT's `policy.sft.fork_error` belongs to task=sort and has no effect here.
"""

from __future__ import annotations

import math

import torch

from runner.config_checks import as_float, as_int, check_keys
from runner.errors import UserError
from runner.tasks.count_asked import CountAsked
from runner.tasks.targets import parse_asked_counts, parse_targets

KEYS = (
    "name",
    "description",
    "words",
    "targets",
    "k",
    "tolerance",
    "successors",
    "zipf",
    "corpus_follows",
    "corpus_seed",
)


class CountInText(CountAsked):
    name = "count-in-text"

    def __init__(
        self,
        words: int,
        targets: tuple[int, ...],
        k: tuple[int, ...],
        tolerance: int,
        seq_len: int,
        successors: int = 8,
        zipf: float = 2.5,
        corpus_follows: float = 1.0,
        corpus_seed: int = 0,
    ):
        self.words, self.successors, self.zipf, self.corpus_seed = words, successors, zipf, corpus_seed
        self.seq_len, self.corpus_follows = seq_len, corpus_follows
        self.bos, self.ask0, self.eos = words, words + 1, words + 1 + len(k)
        self.vocab_size = words + len(k) + 2
        super().__init__(self.vocab_size, targets, k, tolerance)
        gen = torch.Generator().manual_seed(corpus_seed)
        # [words, successors]: each word's next words, most likely first, and their probabilities
        self.next_words = torch.stack([torch.randperm(words, generator=gen)[:successors] for _ in range(words)])
        ranks = torch.arange(1, successors + 1, dtype=torch.float64)
        chain = (ranks**-zipf / (ranks**-zipf).sum()).expand(words, -1)  # [words, successors]
        self.chain_count = seq_len * self._stationary_share(chain)[0]  # the chain's own expected count
        probs, starts = [], []
        for count in k:
            wanted = self.chain_count + corpus_follows * (count - self.chain_count)
            tilted = self._tilted(chain, self._tilt_for(chain, wanted / seq_len))
            probs.append(tilted)
            starts.append(self._stationary_share(tilted)[1])
        # [X, words, successors] each ask's next-word probabilities; [X, words] its first word's (stationary)
        self.next_probs, self.start_probs = torch.stack(probs).float(), torch.stack(starts).float()

    def _tilted(self, chain: torch.Tensor, lam: float) -> torch.Tensor:
        """[words, successors]: the chain with every transition into a target ×lam, renormalised."""
        weight = torch.where(self.is_target[self.next_words], lam, 1.0).to(chain.dtype)
        tilted = chain * weight
        return tilted / tilted.sum(-1, keepdim=True)

    def _stationary_share(self, probs: torch.Tensor) -> tuple[float, torch.Tensor]:
        """(the targets' share of the words, the stationary law [words]) of a chain: π (P − I) = 0, Σ π = 1."""
        dense = torch.zeros(self.words, self.words, dtype=torch.float64).scatter_add_(1, self.next_words, probs)
        system = (dense - torch.eye(self.words, dtype=torch.float64)).T
        system[-1] = 1.0  # one balance equation is redundant: normalisation instead
        rhs = torch.zeros(self.words, dtype=torch.float64)
        rhs[-1] = 1.0
        law = torch.linalg.solve(system, rhs)
        return float(law[self.is_target[: self.words]].sum()), law

    def _tilt_for(self, chain: torch.Tensor, share: float) -> float:
        """λ whose tilted chain has this stationary share of targets (bisection on log λ)."""
        lo, hi = -20.0, 20.0
        for _ in range(40):
            mid = (lo + hi) / 2
            if self._stationary_share(self._tilted(chain, math.exp(mid)))[0] < share:
                lo = mid
            else:
                hi = mid
        return math.exp((lo + hi) / 2)

    @classmethod
    def from_config(cls, cfg, rollout):
        check_keys("task", cfg, KEYS)
        words = as_int("task", cfg, "words", low=2)
        seq_len = as_int("rollout", rollout, "seq_len", low=1)
        targets = parse_targets(cfg, words)
        k = parse_asked_counts(cfg, seq_len)
        successors = as_int("task", cfg, "successors", low=1, default=8)
        if successors > words:
            raise UserError(f"task.successors ({successors}) must be <= task.words ({words})")
        return cls(
            words,
            targets,
            k,
            as_int("task", cfg, "tolerance", low=0, default=0),
            seq_len,
            successors,
            as_float("task", cfg, "zipf", low=0.0, default=2.5),
            as_float("task", cfg, "corpus_follows", low=0.0, high=1.0, default=1.0),
            as_int("task", cfg, "corpus_seed", low=0, default=0),
        )

    @property
    def prompt_len(self) -> int:
        return 2

    @property
    def response_len(self) -> int:
        return 1  # any length: the count is asked of whatever the response holds

    def identity(self) -> dict:
        """What the warm start depends on (the SFT cache key)."""
        return {
            "name": self.name,
            "words": self.words,
            "asks": len(self.k),
            "successors": self.successors,
            "zipf": self.zipf,
            "k": list(self.k),
            "corpus_follows": self.corpus_follows,
            "corpus_seed": self.corpus_seed,
        }

    def sample_prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """[n, 2]: BOS, ASK_i with i uniform."""
        ask = self.ask0 + torch.randint(len(self.k), (n, 1), generator=generator, device=generator.device)
        return torch.cat([torch.full_like(ask, self.bos), ask], dim=1)

    def reward(self, prompts, tokens, mask):
        asked = self.asked.to(tokens.device)[prompts[:, -1] - self.ask0]  # [N]
        return ((self.count(tokens, mask) - asked).abs() <= self.tolerance).to(mask.dtype)

    def teacher(
        self, prompts: torch.Tensor, generator: torch.Generator, fork_error: float, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The corpus: ([n, width] words of the ask's tilted chain, [n, width] mask of ones)."""
        n, device = prompts.shape[0], prompts.device
        ask = prompts[:, -1] - self.ask0  # [n]
        next_words, next_probs = self.next_words.to(device), self.next_probs.to(device)
        out = torch.empty(n, width, dtype=torch.long, device=device)
        word = torch.multinomial(self.start_probs.to(device)[ask], 1, generator=generator).squeeze(1)
        for t in range(width):
            out[:, t] = word
            pick = torch.multinomial(next_probs[ask, word], 1, generator=generator).squeeze(1)
            word = next_words[word, pick]
        return out, torch.ones(n, width, device=device)
