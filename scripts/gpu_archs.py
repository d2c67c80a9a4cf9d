"""Write scripts/gpu_archs.json: the architectures the GPU check builds with random weights, read
from the shipped models' GGUF metadata (Qwen2.5-Coder 1.5B and 0.5B, SmolLM2-135M), plus
Qwen2.5-Coder-7B's published configuration (no 7B ships here). No weights travel to the GPU, only
these shapes.

    .venv/bin/python scripts/gpu_archs.py      # fetches the models on first use
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).with_name("gpu_archs.json")
SHIPPED = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m")
# Qwen/Qwen2.5-Coder-7B-Instruct config.json as published (Hugging Face, 2024-11).
QWEN_7B = {"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
           "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
           "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
           "tie_word_embeddings": False, "source": "Qwen/Qwen2.5-Coder-7B-Instruct config.json (published)"}


def from_gguf(path: Path, name: str) -> dict:
    """A transformers config (as a dict) from a GGUF file's metadata and tensor shapes."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))

    def field(key: str):
        f = reader.fields[key]
        value = f.parts[f.data[0]]
        return bytes(value).decode() if f.types and f.types[0].name == "STRING" else value.tolist()[0]

    arch = field("general.architecture")
    shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
    vocab = shapes["token_embd.weight"][1]  # GGUF lists dimensions innermost first
    return {
        "model_type": {"qwen2": "qwen2", "llama": "llama"}[arch],
        "vocab_size": vocab,
        "hidden_size": field(f"{arch}.embedding_length"),
        "intermediate_size": field(f"{arch}.feed_forward_length"),
        "num_hidden_layers": field(f"{arch}.block_count"),
        "num_attention_heads": field(f"{arch}.attention.head_count"),
        "num_key_value_heads": field(f"{arch}.attention.head_count_kv"),
        "max_position_embeddings": field(f"{arch}.context_length"),
        # float32 in the file: printed back at float32's precision
        "rope_theta": float(f"{field(f'{arch}.rope.freq_base'):.7g}"),
        "rms_norm_eps": float(f"{field(f'{arch}.attention.layer_norm_rms_epsilon'):.7g}"),
        "tie_word_embeddings": "output.weight" not in shapes,
        "source": f"GGUF metadata of {name} as shipped ({path.stat().st_size:,} bytes)",
    }


def main() -> None:
    from specdec.models import resolve

    archs = {}
    for name in SHIPPED:
        archs[name] = from_gguf(Path(resolve(name, None, need_hf=False).gguf), name)
    archs["qwen2.5-coder-7b"] = QWEN_7B
    OUT.write_text(json.dumps(archs, indent=1) + "\n")
    print(f"wrote {OUT}: {', '.join(archs)}")


if __name__ == "__main__":
    main()
