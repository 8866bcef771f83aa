#!/usr/bin/env python3
"""The reference side of tests/tokens/tokenizer_test.cc: Hugging Face `tokenizers` makes
byte-level BPE tokenizer.json files and encodes and decodes with them.

    tokenizer_reference.py make OUT_DIR CORPUS...
        writes, trained on the CORPUS files, OUT_DIR/prepared/tokenizer.json (the one
        scripts/prepare_data.py trains when given no tokenizer), OUT_DIR/gpt2_style.json
        (GPT-2's layout: a prefix space, the ByteLevel post-processor, <|endoftext|> special and
        <sep> a non-special added token), OUT_DIR/ignore_merges.json (gpt2_style with
        ignore_merges), OUT_DIR/llama3_style.json (Llama 3's layout: Split by its pattern,
        ByteLevel without its regex, ignore_merges, a beginning-of-text template),
        OUT_DIR/llama2_style.json (Llama 2's SentencePiece layout: Prepend and Replace
        normalizers, no pre-tokenizer, byte_fallback with "<0xAB>" tokens, an alphabet too
        small for the corner cases, <s> template, Replace/ByteFallback/Fuse/Strip decoder) and
        two Metaspace variants of it (metaspace_first.json: prepend scheme first, no split, as
        transformers' newer Llama conversion; metaspace_always.json: always, split, the
        Metaspace decoder, fuse_unk with some byte tokens missing), and prints their paths, one
        a line, then OUT_DIR/qwen2_style.json (Qwen2's layout: the NFC normalizer, Split by
        Qwen2's pattern, ByteLevel without its regex, <|im_start|> and <|im_end|>),
        OUT_DIR/gemma_style.json (Gemma's layout: llama2_style's model with the Replace
        normalizer alone, Split(" ", MergedWithPrevious) and a decoder without Strip) and
        OUT_DIR/split_<behavior>.json (the same layout with Split("\u2581", behavior), which
        cuts the normalized text, for each of the five behaviors, each trained with its own
        split so that its tokens span what it keeps together).

    tokenizer_reference.py nfc IN OUT
        writes each line of IN (UTF-8, lines split at "\n" only) in Unicode's NFC, by Python's
        unicodedata, to OUT.

    tokenizer_reference.py run TOKENIZER_JSON REQUEST_JSON OUTPUT_JSON
        REQUEST_JSON is {"texts": [paths of UTF-8 files], "id_lists": [[ids], ...]}; writes one
        JSON object to OUTPUT_JSON: "encodings", per text {"ids", "ids_special", "decoded",
        "decoded_skip"} (encode with add_special_tokens=False and True; decode of the first
        ids with and without skip_special_tokens),
        and "decodings", per id list {"decoded", "decoded_skip"}.
"""
import json
import os
import subprocess
import sys

from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

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


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def llama3_style(texts, vocab_size=1500):
    tokenizer = Tokenizer(models.BPE(ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    begin = tokenizer.token_to_id("<|begin_of_text|>")
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", begin)])])
    return tokenizer


QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen2_style(texts, vocab_size=1500):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def llama2_style(corpus, path, normalizer=None, pre_tokenizer=None):
    """Trained with a Metaspace pre-tokenizer (so that tokens stay inside words, as
    SentencePiece's do), saved without one, as Llama 2's tokenizer.json is. With
    `pre_tokenizer`, trained with that one and after `normalizer` (Replace(" ", "\u2581")
    then), and saved with both."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizer or normalizers.Sequence([
        normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tokenizer.pre_tokenizer = pre_tokenizer or pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="never", split=True)
    tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                           decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=1000, min_frequency=2, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=90)
    tokenizer.train_from_iterator((read_text(path) for path in corpus), trainer=trainer)
    begin = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", begin)])
    tokenizer.save(path)
    with open(path, encoding="utf-8") as stream:
        data = json.load(stream)
    if pre_tokenizer is None:
        data["pre_tokenizer"] = None
    vocab = data["model"]["vocab"]
    for byte in range(256):
        token = "<0x%02X>" % byte
        if token not in vocab:
            vocab[token] = len(vocab)
    return data


def gemma_style(llama2):
    """Gemma's layout over llama2_style's model (its tokenizer.json as a dict): the Replace
    normalizer alone, Split(" ", MergedWithPrevious), a decoder without Strip."""
    gemma = json.loads(json.dumps(llama2))
    gemma["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    gemma["pre_tokenizer"] = {"type": "Split", "pattern": {"String": " "},
                              "behavior": "MergedWithPrevious", "invert": False}
    gemma["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}
    return gemma


def save_json(data, path):
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(data, stream, ensure_ascii=False)
    Tokenizer.from_file(path)  # loads
    print(path)


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
    path = os.path.join(out_dir, "llama3_style.json")
    llama3_style(read_text(path) for path in corpus).save(path)
    print(path)
    llama2 = llama2_style(corpus, os.path.join(out_dir, "llama2_trained.json"))
    save_json(llama2, os.path.join(out_dir, "llama2_style.json"))
    first = json.loads(json.dumps(llama2))
    first["normalizer"] = None
    first["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                              "prepend_scheme": "first", "split": False}
    save_json(first, os.path.join(out_dir, "metaspace_first.json"))
    always = json.loads(json.dumps(llama2))
    always["normalizer"] = None
    always["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                               "prepend_scheme": "always", "split": True}
    always["decoder"] = {"type": "Metaspace", "replacement": "\u2581",
                         "prepend_scheme": "always", "split": True}
    # Bytes 0x80-0xBF missing: a character whose bytes are not all there becomes <unk>.
    for byte in range(0x80, 0xC0):
        del always["model"]["vocab"]["<0x%02X>" % byte]
    ids = sorted(always["model"]["vocab"].items(), key=lambda item: item[1])
    always["model"]["vocab"] = {token: i for i, (token, _) in enumerate(ids)}
    save_json(always, os.path.join(out_dir, "metaspace_always.json"))
    path = os.path.join(out_dir, "qwen2_style.json")
    qwen2_style(read_text(path) for path in corpus).save(path)
    print(path)
    gemma = gemma_style(llama2)
    save_json(gemma, os.path.join(out_dir, "gemma_style.json"))
    for behavior in ("removed", "isolated", "merged_with_previous", "merged_with_next",
                     "contiguous"):
        split = llama2_style(corpus, os.path.join(out_dir, "split_trained.json"),
                             normalizers.Replace(" ", "\u2581"),
                             pre_tokenizers.Split("\u2581", behavior))
        split["decoder"] = gemma["decoder"]
        save_json(split, os.path.join(out_dir, "split_%s.json" % behavior))


def nfc(in_path, out_path):
    import unicodedata
    with open(in_path, encoding="utf-8", newline="") as stream:
        lines = stream.read().split("\n")
    with open(out_path, "w", encoding="utf-8", newline="") as stream:
        stream.write("\n".join(unicodedata.normalize("NFC", line) for line in lines))


def run(tokenizer_path, request_path, output_path):
    tokenizer = Tokenizer.from_file(tokenizer_path)
    with open(request_path, encoding="utf-8") as stream:
        request = json.load(stream)
    encodings = []
    for path in request["texts"]:
        text = read_text(path)
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        encodings.append({"ids": ids,
                          "ids_special": tokenizer.encode(text, add_special_tokens=True).ids,
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
    elif len(sys.argv) == 4 and sys.argv[1] == "nfc":
        nfc(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: tokenizer_reference.py make OUT_DIR CORPUS... | "
                 "run TOKENIZER_JSON REQUEST_JSON OUTPUT_JSON | nfc IN OUT")


if __name__ == "__main__":
    main()
