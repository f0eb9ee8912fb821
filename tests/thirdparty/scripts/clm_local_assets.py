"""Tiny local inputs for transformers' examples/pytorch/language-modeling/run_clm_no_trainer.py
(third-party fixture builder; no hub download).

``python clm_local_assets.py DIR`` writes into DIR:
- ``train.txt`` / ``validation.txt``: generated sentences, one a line;
- ``tokenizer/``: a word-level tokenizer trained on train.txt with the ``tokenizers``
  library, saved as a ``PreTrainedTokenizerFast`` (``AutoTokenizer`` loads it);
- ``config/``: a 2-layer GPT-2 config sized to that vocabulary (``AutoConfig`` loads it).

Sizes are chosen for the script's ``--block_size 16 --per_device_train_batch_size 4``:
exactly 20 training blocks (5 micro-batches an epoch, so ``--gradient_accumulation_steps 2``
ends each epoch on a one-micro-batch step) and 48 validation blocks (12 evaluation
forwards at ``--per_device_eval_batch_size 4``). It prints
``SS assets train_blocks=.. validation_blocks=..`` (counted with the saved tokenizer the way
the script groups texts: all tokens of a split concatenated, cut into whole blocks).
"""

import random
import sys
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import GPT2Config, PreTrainedTokenizerFast

BLOCK = 16
WORDS = ("the cat dog bird sees chases likes a small big red quick slow tree house "
         "river runs sleeps near over under and").split()


def sentences(rng, n_tokens):
    out, total = [], 0
    while total < n_tokens:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
        out.append(line)
        total += len(line.split())
    return out, total


def write_split(path, rng, n_blocks):
    # the script's "text" loader keeps line breaks; the word-level tokenizer drops them,
    # so the token count is the word count; trim to exactly n_blocks * BLOCK words
    lines, _ = sentences(rng, n_blocks * BLOCK)
    words = " ".join(lines).split()[: n_blocks * BLOCK]
    text, i = [], 0
    while i < len(words):
        k = rng.randint(3, 9)
        text.append(" ".join(words[i:i + k]))
        i += k
    path.write_text("\n".join(text) + "\n")


def main(root):
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    write_split(root / "train.txt", rng, 20)
    write_split(root / "validation.txt", rng, 48)

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train([str(root / "train.txt")], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                                   model_max_length=64)
    fast.save_pretrained(root / "tokenizer")
    GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=64, vocab_size=len(fast),
               bos_token_id=0, eos_token_id=0).save_pretrained(root / "config")

    counts = {}
    for split in ("train", "validation"):
        ids = [i for line in (root / f"{split}.txt").read_text().splitlines()
               for i in fast(line)["input_ids"]]
        counts[split] = len(ids) // BLOCK
    print(f"SS assets train_blocks={counts['train']!r} "
          f"validation_blocks={counts['validation']!r}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
