"""A tiny Llama for real vLLM on a CPU, made on the spot: nothing is downloaded.

``scripts/install-vllm.sh`` runs this file with the vLLM venv's python (it has torch, transformers and tokenizers;
the project's venv has none of them), as ``python vllm_model.py OUT_DIR``. It writes a Hugging Face model
directory that ``vllm serve OUT_DIR`` loads:

- a byte-level BPE tokenizer trained with ``tokenizers`` on generated English-like text (any UTF-8 input
  tokenizes, nothing is ever unknown), with a chat template, so ``/v1/chat/completions`` works;
- a ``LlamaConfig`` of 2 layers, hidden size 128, 4 heads (head size 32), random weights from a fixed seed;
- in ``OUT_DIR/embedding/``, a second model for ``/v1/embeddings`` (served by its own ``vllm serve --runner
  pooling``): a ``BertModel`` (encoder only, no pooler head) of the same size, the same tokenizer with ``<|bos|>``
  put first as BERT's ``[CLS]``, whose hidden state vLLM pools (a ``BertModel``'s default pooling is CLS).

The answers are gibberish; what the tests need is vLLM's real scheduler, API server, metrics and errors around a
model that loads in seconds. Same inputs, same files: the corpus comes from a seeded generator, BPE training is
deterministic for a given corpus, and the weights come from a seeded torch generator. :data:`MODEL_VERSION` names
the recipe: change anything here and bump it, so installs make a new ``model-<version>`` directory.

Stdlib, torch, transformers and tokenizers only: it must not import tokenpools or tokenpools_dev, which the vLLM
venv does not have. Those imports are inside :func:`make_model`, so importing the module costs nothing.
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
from pathlib import Path

MODEL_VERSION = 2
EMBEDDING_DIR = "embedding"
"""The embedding model's folder inside the model's (version 2 on; version 1 had none)."""
EMBEDDING_MAX_POSITIONS = 512
SEED = 20260801
VOCAB_SIZE = 4096
MAX_POSITION_EMBEDDINGS = 2048
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|eos|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
_WORDS = (
    "the a an of to in on for with by from at as is are was were be been has have had do does did not no yes "
    "token tokens pool pools tenant tenants request requests limit limits budget window second seconds minute "
    "model models cache prefix prompt completion stream chunk queue running waiting admitted refused retry "
    "proxy backend replica replicas scale scaling metric metrics latency throughput priority fair share spot "
    "guaranteed preemptible burst debt usage capacity concurrency hello world please thanks answer question "
    "what why how when where who which this that these those it its we you they he she one two three four five"
).split()


def corpus(lines: int = 20_000, seed: int = SEED) -> list[str]:
    """Generated sentences: the words above, numbers, punctuation, capitals and a few non-ASCII characters."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 18))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 100_000)))
        if rng.random() < 0.05:
            words.insert(rng.randrange(len(words)), rng.choice(["café", "naïve", "über", "日本", "€5", "→"]))
        sentence = " ".join(words)
        out.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "?", "!", ",", ":", ";"]))
    return out


def make_model(out_dir: Path) -> Path:
    """Write the tokenizer and the model into ``out_dir``, the embedding model into ``out_dir/embedding`` (replaced
    whole, through a temporary sibling)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would survive the rename
    try:
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        bpe.train_from_iterator(corpus(), trainer=trainer)
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|bos|>", eos_token="<|eos|>",
                                            pad_token="<|pad|>", model_max_length=MAX_POSITION_EMBEDDINGS)
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.save_pretrained(tmp)

        config = LlamaConfig(
            vocab_size=bpe.get_vocab_size(), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POSITION_EMBEDDINGS,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True, dtype="bfloat16")
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        make_embedding_model(bpe.to_str(), tmp / EMBEDDING_DIR)

        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def make_embedding_model(bpe_json: str, out_dir: Path) -> Path:
    """A tiny BERT into ``out_dir``: the chat model's trained tokenizer (``bpe_json``, as ``Tokenizer.to_str`` writes
    it) with ``<|bos|>`` put first as its ``[CLS]``, and a ``BertModel`` of 2 layers, hidden size 128, 4 heads, 512
    positions, random weights from a fixed seed."""
    import torch
    from tokenizers import Tokenizer, processors
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    cls = Tokenizer.from_str(bpe_json)  # the chat model's tokenizer adds no special token
    cls.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A $B", special_tokens=[("<|bos|>", cls.token_to_id("<|bos|>"))])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=cls, bos_token="<|bos|>", cls_token="<|bos|>",
                                        eos_token="<|eos|>", pad_token="<|pad|>",
                                        model_max_length=EMBEDDING_MAX_POSITIONS)
    tokenizer.save_pretrained(out_dir)
    config = BertConfig(
        vocab_size=cls.get_vocab_size(), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=EMBEDDING_MAX_POSITIONS, pad_token_id=tokenizer.pad_token_id,
        dtype="bfloat16")
    torch.manual_seed(SEED + 1)
    BertModel(config, add_pooling_layer=False).to(torch.bfloat16).save_pretrained(out_dir)
    return out_dir


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python vllm_model.py OUT_DIR", file=sys.stderr)
        return 2
    print(make_model(Path(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
