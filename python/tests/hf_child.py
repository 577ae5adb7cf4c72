"""One process of the transformers restart test: builds the model from its saved config and
weights, then either runs uninterrupted (prefill, store the cache, continue greedily) or, in
a new process, restores the cache from the store and continues. Prints one JSON line."""
import json
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import kvtier
import kvtier.hf

STEPS = 8


def continue_greedy(model, cache, last):
    """Feed ``last`` then greedy steps: the tokens and the first step's logits."""
    out, tokens, first = last, [], None
    with torch.no_grad():
        for _ in range(STEPS):
            r = model(out, past_key_values=cache, use_cache=True)
            logits = r.logits[:, -1, :].float()
            first = logits.cpu() if first is None else first
            out = logits.argmax(-1, keepdim=True)
            tokens.append(int(out))
            cache = r.past_key_values
    return tokens, first


def main():
    mode, work, store_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    cfg = LlamaConfig.from_json_file(f"{work}/config.json")
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(torch.load(f"{work}/weights.pt"))
    model = model.to("cuda", torch.bfloat16).eval()
    prompt = torch.load(f"{work}/prompt.pt").to("cuda")
    ident = dict(model_id="hf/tiny-llama", config_fingerprint="fp-hf", tokenizer_hash="tk-hf")
    with kvtier.Store(store_dir, **ident) as store:
        if mode == "uninterrupted":
            with torch.no_grad():
                r = model(prompt[:, :-1], use_cache=True)
            kvtier.hf.save_cache(store, prompt[:, :-1], r.past_key_values)
            served, cache = 0, r.past_key_values
        else:
            served, cache = kvtier.hf.restore_cache(store, prompt)
        tokens, first = continue_greedy(model, cache, prompt[:, -1:])
    torch.save(first, f"{work}/logits-{mode}.pt")
    print(json.dumps({"served": served, "tokens": tokens}))


if __name__ == "__main__":
    main()
