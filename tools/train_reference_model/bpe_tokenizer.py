"""Byte-level BPE: training, encoding, decoding, and export as Hugging Face files.

The layout follows DeepSeek-V3's tokenizer: ids 0, 1, 2 are <｜begin▁of▁sentence｜>,
<｜end▁of▁sentence｜> and <｜▁pad▁｜>; ids 3..258 are the 256 ByteLevel characters in
alphabet order; merges follow; the chat special tokens take the highest ids. Training is
the classic algorithm: count pre-tokenized pieces, then repeatedly merge the most frequent
adjacent pair (ties: the pair of smaller token ids), until the vocabulary is full.
"""

import collections
import heapq
import json

import pretokenizer

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
# DeepSeek-V3's added tokens after the placeholders, in its order.
CHAT_SPECIALS = [
    "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜User｜>", "<｜Assistant｜>", "<|EOT|>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>", "<｜tool▁sep｜>"
]
# DeepSeek-V3 marks only these chat specials as "special" (skipped when decoding).
SPECIAL_FLAGGED = {BOS, EOS, PAD, "<|EOT|>"}

# DeepSeek-V3's chat template (tokenizer_config.json of deepseek-ai/DeepSeek-V3).
CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
    "{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, "
    "system_prompt='', is_first_sp=true) %}{%- for message in messages %}{%- if "
    "message['role'] == 'system' %}{%- if ns.is_first_sp %}{% set ns.system_prompt = "
    "ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}{%- else %}"
    "{% set ns.system_prompt = ns.system_prompt + '\\n\\n' + message['content'] %}{%- endif "
    "%}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message in "
    "messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}"
    "{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' "
    "and message['content'] is none %}{%- set ns.is_tool = false -%}{%- for tool in "
    "message['tool_calls']%}{%- if not ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜>"
    "<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + "
    "'\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + "
    "'<｜tool▁call▁end｜>'}}{%- set ns.is_first = true -%}{%- else %}{{'\\n' + "
    "'<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + "
    "'\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + "
    "'<｜tool▁call▁end｜>'}}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- "
    "endfor %}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is "
    "not none %}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + "
    "'<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{{'<｜Assistant｜>' + "
    "message['content'] + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if "
    "message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}"
    "{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + "
    "'<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'\\n"
    "<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}"
    "{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}"
    "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}")

_BYTE_TO_CHAR, _BYTE_ORDER = pretokenizer.bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}


def to_byte_chars(piece):
    return "".join(_BYTE_TO_CHAR[b] for b in piece.encode("utf-8"))


class Tokenizer:
    """A trained byte-level BPE vocabulary: `vocab` (token string -> id) and `merges`
    (ordered pairs of token strings)."""

    def __init__(self, vocab, merges):
        self.vocab = vocab
        self.merges = merges
        self.id_to_token = {i: t for t, i in vocab.items()}
        self.ranks = {pair: r for r, pair in enumerate(merges)}
        self.special_ids = {t: vocab[t] for t in [BOS, EOS, PAD] + CHAT_SPECIALS}
        self.bos_id = vocab[BOS]
        self.eos_id = vocab[EOS]
        self._cache = {}

    def _bpe(self, word):
        ids = self._cache.get(word)
        if ids is not None:
            return ids
        parts = list(word)
        while len(parts) > 1:
            best, best_rank = None, None
            for i in range(len(parts) - 1):
                r = self.ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best is None:
                break
            a, b = parts[best], parts[best + 1]
            merged, i = [], 0
            while i < len(parts):
                if i < len(parts) - 1 and parts[i] == a and parts[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        ids = [self.vocab[p] for p in parts]
        if len(self._cache) < 1_000_000:
            self._cache[word] = ids
        return ids

    def encode_ordinary(self, text):
        """Token ids of plain text (special token strings are not recognised)."""
        out = []
        for piece in pretokenizer.pre_tokenize(text):
            out.extend(self._bpe(to_byte_chars(piece)))
        return out

    def encode(self, text, add_bos=True):
        """Token ids of text that may contain special token strings (as the chat template
        produces); a BOS is prepended like tokenizer_config.json's add_bos_token."""
        specials = sorted(self.special_ids, key=len, reverse=True)
        out = [self.bos_id] if add_bos else []
        pos = 0
        while pos < len(text):
            nxt = None
            for s in specials:
                j = text.find(s, pos)
                if j >= 0 and (nxt is None or j < nxt[0]):
                    nxt = (j, s)
            end = nxt[0] if nxt else len(text)
            out.extend(self.encode_ordinary(text[pos:end]))
            if nxt:
                out.append(self.special_ids[nxt[1]])
                end += len(nxt[1])
            pos = end
        return out

    def decode(self, ids, skip_special=True):
        data = bytearray()
        for i in ids:
            tok = self.id_to_token[int(i)]
            if tok in self.special_ids:
                if not (skip_special and tok in SPECIAL_FLAGGED):
                    data.extend(tok.encode("utf-8"))
                continue
            data.extend(_CHAR_TO_BYTE[c] for c in tok)
        return data.decode("utf-8", errors="replace")


def train(texts, vocab_size, log=print):
    """Trains byte-level BPE on an iterable of strings; returns a Tokenizer with exactly
    `vocab_size` ids."""
    base = [BOS, EOS, PAD] + [_BYTE_TO_CHAR[b] for b in _BYTE_ORDER]
    target = vocab_size - len(CHAT_SPECIALS)
    if target <= len(base):
        raise ValueError(f"vocab_size {vocab_size} is too small: need more than "
                         f"{len(base) + len(CHAT_SPECIALS)}")
    counts = collections.Counter()
    for text in texts:
        counts.update(pretokenizer.pre_tokenize(text))
    token_of = {t: i for i, t in enumerate(base)}
    strings = list(base)
    words, freqs = [], []
    for piece, c in counts.items():
        words.append([token_of[ch] for ch in to_byte_chars(piece)])
        freqs.append(c)
    log(f"bpe: {len(words)} distinct pieces, {sum(freqs)} pieces in total")

    pair_count = collections.Counter()
    pair_words = collections.defaultdict(set)
    for w, (word, f) in enumerate(zip(words, freqs)):
        for a, b in zip(word, word[1:]):
            pair_count[(a, b)] += f
            pair_words[(a, b)].add(w)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)

    merges, merged_pairs = [], set()
    while len(strings) < target and heap:
        neg, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg or -neg <= 0:
            continue  # stale entry
        a, b = pair
        merged_str = strings[a] + strings[b]
        new_id = token_of.get(merged_str)
        if new_id is None:
            new_id = len(strings)
            token_of[merged_str] = new_id
            strings.append(merged_str)
        if (strings[a], strings[b]) not in merged_pairs:
            merged_pairs.add((strings[a], strings[b]))
            merges.append((strings[a], strings[b]))
        touched = set()
        for w in list(pair_words[pair]):
            word, f = words[w], freqs[w]
            for x, y in zip(word, word[1:]):
                pair_count[(x, y)] -= f
                touched.add((x, y))
            out, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and word[i] == a and word[i + 1] == b:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            words[w] = out
            for x, y in zip(out, out[1:]):
                pair_count[(x, y)] += f
                pair_words[(x, y)].add(w)
                touched.add((x, y))
        for p in touched:
            c = pair_count[p]
            if c > 0:
                heapq.heappush(heap, (-c, p))
            else:
                pair_count.pop(p, None)
                pair_words.pop(p, None)
        if len(merges) % 500 == 0:
            log(f"bpe: {len(merges)} merges, vocabulary {len(strings) + len(CHAT_SPECIALS)}")
    vocab = {t: i for i, t in enumerate(strings)}
    for s in CHAT_SPECIALS:
        vocab[s] = len(vocab)
    if len(vocab) != vocab_size:
        raise ValueError(f"training text too small: reached {len(vocab)} of {vocab_size} ids")
    return Tokenizer(vocab, merges)


def render_chat(messages, add_generation_prompt=True):
    """What CHAT_TEMPLATE renders for system/user/assistant messages without tool calls
    (written out so that no jinja2 is needed here; checked against jinja2 by the tests)."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    out = BOS + system
    for m in messages:
        if m["role"] == "user":
            out += "<｜User｜>" + m["content"]
        elif m["role"] == "assistant":
            out += "<｜Assistant｜>" + m["content"] + EOS
        elif m["role"] != "system":
            raise ValueError(f"render_chat: role {m['role']!r} is not supported")
    return out + ("<｜Assistant｜>" if add_generation_prompt else "")


def _added_token(id_, content, special, normalized):
    return {"id": id_, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": normalized, "special": special}


def tokenizer_json(tok):
    """tokenizer.json in DeepSeek-V3's structure."""
    added = [_added_token(tok.vocab[t], t, True, False) for t in (BOS, EOS, PAD)]
    added += [_added_token(tok.vocab[t], t, t in SPECIAL_FLAGGED, True) for t in CHAT_SPECIALS]
    bpe_vocab = {t: i for t, i in sorted(tok.vocab.items(), key=lambda kv: kv[1])
                 if t not in CHAT_SPECIALS}
    split = lambda pattern: {"type": "Split", "pattern": {"Regex": pattern},
                             "behavior": "Isolated", "invert": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": []},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            split(pretokenizer.DIGITS_PATTERN), split(pretokenizer.CJK_PATTERN),
            split(pretokenizer.MAIN_PATTERN),
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                           "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": bpe_vocab,
                  "merges": [a + " " + b for a, b in tok.merges]},
    }


def tokenizer_config_json(max_length):
    """tokenizer_config.json in DeepSeek-V3's structure, with its chat template."""
    def added(content):
        return {"__type": "AddedToken", "content": content, "lstrip": False,
                "normalized": True, "rstrip": False, "single_word": False}
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": added(BOS),
        "clean_up_tokenization_spaces": False,
        "eos_token": added(EOS),
        "legacy": True,
        "model_max_length": max_length,
        "pad_token": added(EOS),
        "sp_model_kwargs": {},
        "unk_token": None,
        "tokenizer_class": "LlamaTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }


def load(path):
    """Reads a tokenizer.json written by tokenizer_json()."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    vocab = dict(data["model"]["vocab"])
    for t in data["added_tokens"]:
        vocab[t["content"]] = t["id"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in data["model"]["merges"]]
    return Tokenizer(vocab, merges)
