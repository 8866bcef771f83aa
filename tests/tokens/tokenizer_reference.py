#!/usr/bin/env python3
"""The reference side of tests/tokens/tokenizer_test.cc: Hugging Face `tokenizers` makes
byte-level BPE tokenizer.json files and encodes and decodes with them.

    tokenizer_reference.py make OUT_DIR CORPUS...
        writes, trained on the CORPUS files, OUT_DIR/prepared/tokenizer.json (the one
        scripts/prepare_data.py trains when given no tokenizer), OUT_DIR/gpt2_style.json
        (GPT-2's layout: a prefix space, the ByteLevel post-processor, <|endoftext|> special and
        <sep> a non-special added token) and OUT_DIR/ignore_merges.json (gpt2_style with
        ignore_merges, as Llama 3's BPE has it), and prints their paths, one a line.

    tokenizer_reference.py run TOKENIZER_JSON REQUEST_JSON OUTPUT_JSON
        REQUEST_JSON is {"texts": [paths of UTF-8 files], "id_lists": [[ids], ...]}; writes one
        JSON object to OUTPUT_JSON: "encodings", per text {"ids", "decoded", "decoded_skip"} (encode with
        add_special_tokens=False; decode of those ids with and without skip_special_tokens),
        and "decodings", per id list {"decoded", "decoded_skip"}.
"""
import json
import os
import subprocess
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

PREPARE_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                            "prepare_data.py")


def read_text(path):
    with open(path, encoding="utf-8", newline="") as stream:
        return stream.read()


def gpt2_style(corpus):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, min_frequency=2, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator((read_text(path) for path in corpus), trainer=trainer)
    tokenizer.add_tokens(["<sep>"])
    return tokenizer


def make(out_dir, corpus):
    os.makedirs(out_dir, exist_ok=True)
    prepared = os.path.join(out_dir, "prepared")
    subprocess.run([sys.executable, PREPARE_DATA, "--output", prepared, "--vocab-size", "700",
                    "--quiet", *corpus], check=True)
    print(os.path.join(prepared, "tokenizer.json"))
    tokenizer = gpt2_style(corpus)
    path = os.path.join(out_dir, "gpt2_style.json")
    tokenizer.save(path)
    print(path)
    with open(path, encoding="utf-8") as stream:
        data = json.load(stream)
    data["model"]["ignore_merges"] = True
    path = os.path.join(out_dir, "ignore_merges.json")
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(data, stream)
    Tokenizer.from_file(path)  # loads
    print(path)


def run(tokenizer_path, request_path, output_path):
    tokenizer = Tokenizer.from_file(tokenizer_path)
    with open(request_path, encoding="utf-8") as stream:
        request = json.load(stream)
    encodings = []
    for path in request["texts"]:
        ids = tokenizer.encode(read_text(path), add_special_tokens=False).ids
        encodings.append({"ids": ids,
                          "decoded": tokenizer.decode(ids, skip_special_tokens=False),
                          "decoded_skip": tokenizer.decode(ids, skip_special_tokens=True)})
    decodings = [{"decoded": tokenizer.decode(ids, skip_special_tokens=False),
                  "decoded_skip": tokenizer.decode(ids, skip_special_tokens=True)}
                 for ids in request["id_lists"]]
    with open(output_path, "w", encoding="utf-8") as stream:
        json.dump({"encodings": encodings, "decodings": decodings}, stream)


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 5 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit("usage: tokenizer_reference.py make OUT_DIR CORPUS... | "
                 "run TOKENIZER_JSON REQUEST_JSON OUTPUT_JSON")


if __name__ == "__main__":
    main()
