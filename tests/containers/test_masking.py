"""Secret values never pass the agent's output mask, however the output is cut into reads."""

from __future__ import annotations

import random

from workers.agent.masking import MASK, SecretMask

SECRETS = ["hunter2-long-secret", "hunter2-long", "wandb_abc123"]


def masked(chunks: list[str]) -> str:
    mask = SecretMask(SECRETS)
    return "".join(mask.feed(chunk) for chunk in chunks) + mask.flush()


def test_values_are_masked_in_one_chunk_and_the_longest_value_wins() -> None:
    assert masked(["key hunter2-long-secret and hunter2-long; wandb_abc123\n"]) == f"key {MASK} and {MASK}; {MASK}\n"


def test_values_split_across_reads_are_masked_at_every_cut() -> None:
    text = "a hunter2-long-secret b wandb_abc123 c hunter2 d"
    expected = f"a {MASK} b {MASK} c hunter2 d"
    for cut in range(len(text) + 1):
        assert masked([text[:cut], text[cut:]]) == expected
    rng = random.Random(7)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), 5))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert masked(chunks) == expected


def test_only_a_possible_start_of_a_secret_is_held_back() -> None:
    mask = SecretMask(SECRETS)
    assert mask.feed("progress 10%\n") == "progress 10%\n"
    assert mask.feed("wait hun") == "wait "
    assert mask.feed("gry\n") == "hungry\n"
    assert mask.feed("end wandb_") == "end "
    assert mask.flush() == "wandb_"


def test_no_secrets_or_tiny_values_change_nothing() -> None:
    assert not SecretMask([]) and not SecretMask(["abc"])
    assert SecretMask(["abc"]).feed("abc abc") == "abc abc"
