"""Structured outputs in `peerserve serve` (vLLM's guided_regex / guided_choice / guided_json /
structured_outputs, OpenAI's response_format) and vLLM's bad_words, as a real process on
loopback with the shipped model. Python's `re`, `json` and `jsonschema` (Debian's python3-jsonschema) judge the answers,
independently of the engine's automata.

Cases (all run; exit 1 if any failed):
- guided_choice, sampled at temperature 1 with several seeds and n = 4: every answer is one of
  the choices, finish_reason "stop";
- guided_regex (a date-like pattern): every answer full-matches under re.fullmatch; streamed,
  the chunks join to such an answer; with max_tokens too small, the text is a prefix a
  continuation could still complete (finish_reason "length");
- guided_json / response_format json_schema / structured_outputs.json: the answer parses and
  validates against the schema (jsonschema.validate); response_format json_object: an object;
- greedy answers with and without --speculative mtp are the same under a constraint;
- forced tool calls (a named tool_choice, "required", with and without parallel calls): each
  call names a tool and its arguments validate against that function's parameters; streamed,
  the argument fragments add up to the same calls; a tool with `"parameters": {}` leaves the
  others' schemas in force, and schemas too large together fall back to any JSON object
  (counted in /metrics);
- bad_words: a word of the greedy answer, banned, is gone from it as the token sequences
  vLLM's rule bans (the word without and with a leading space, from /tokenize);
- bad input gets a 400 naming the field: a regex outside the syntax, two kinds at once,
  guided_grammar, a schema keyword the converter refuses, tools with tool_choice auto, an
  unknown response_format type.
Usage: structured_output_test.py PEERSERVE_BINARY SOURCE_DIR
"""
import json
import os
import re
import sys

import jsonschema

from serve_harness import ServeProcess, case, exit_code

BIN, SRC = sys.argv[1], sys.argv[2]
MODEL = os.path.join(SRC, "models", "peerserve-dsv3-tiny")


def start_server(*flags):
    return ServeProcess(BIN, MODEL, *flags)


def completion(server, extra, prompt="The answer is", **kw):
    body = {"prompt": prompt, "max_tokens": kw.pop("max_tokens", 48), **extra, **kw}
    status, r = server.post("/v1/completions", body)
    assert status == 200, (status, r)
    return r


def chat(server, extra, **kw):
    body = {"messages": [{"role": "user", "content": "Tell me about a person."}],
            "max_tokens": kw.pop("max_tokens", 96), **extra, **kw}
    status, r = server.post("/v1/chat/completions", body)
    assert status == 200, (status, r)
    return r


CHOICES = ["red", "green", "blue sky", "yellow, maybe"]
DATE = r"20[0-9]{2}-(?:0[1-9]|1[0-2])-[0-3][0-9]"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
ZONE = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": ZONE}}]
TOOL_SCHEMAS = {"get_weather": WEATHER, "get_time": ZONE}


def forced_tool_calls(server):
    """A named tool_choice and "required" decode under the functions' schemas: every call
    the answer makes names one of the tools and its arguments validate (jsonschema)."""
    def calls_of(message):
        return [(c["function"]["name"], c["function"]["arguments"])
                for c in message.get("tool_calls") or []]

    named = {"type": "function", "function": {"name": "get_weather"}}
    finished = 0
    for choice, parallel, seed in [(named, True, 1), (named, True, 2), ("required", False, 3),
                                   ("required", False, 4), ("required", True, 5)]:
        body = {"messages": [{"role": "user", "content": "Weather in Paris?"}],
                "tools": TOOLS, "tool_choice": choice, "parallel_tool_calls": parallel,
                "temperature": 1.0, "seed": seed, "max_tokens": 96}
        status, r = server.post("/v1/chat/completions", body)
        assert status == 200, (status, r)
        c = r["choices"][0]
        calls = calls_of(c["message"])
        if c["finish_reason"] == "length":
            continue  # cut inside a call (or, in parallel, after many): nothing to judge
        assert c["finish_reason"] == "tool_calls", c
        assert calls and (parallel or len(calls) == 1), calls
        for name, arguments in calls:
            assert name in TOOL_SCHEMAS and (choice == "required" or name == "get_weather"), calls
            try:
                jsonschema.validate(json.loads(arguments), TOOL_SCHEMAS[name])
            except (ValueError, jsonschema.ValidationError) as e:
                raise AssertionError(f"{choice}: {name} {arguments!r}: {e}")
        finished += 1
        # Streamed, the same call (same seed): the argument fragments add up to it.
        status, chunks = server.post("/v1/chat/completions", dict(body, stream=True), stream=True)
        assert status == 200, chunks
        streamed = {}
        for chunk in chunks:
            for delta_call in (chunk["choices"][0]["delta"].get("tool_calls") or []
                               if chunk["choices"] else []):
                name, args = streamed.get(delta_call["index"], ("", ""))
                fn = delta_call.get("function") or {}
                streamed[delta_call["index"]] = (name + (fn.get("name") or ""),
                                                 args + (fn.get("arguments") or ""))
        assert [streamed[i] for i in sorted(streamed)] == calls, (streamed, calls)
    assert finished >= 3, f"only {finished} of 5 forced answers ended within max_tokens"
    # Tools without parameters, or with {} (any JSON value: over the automaton's bounds),
    # fall back to any JSON object: the calls still name a tool and carry an object.
    loose = [{"type": "function", "function": {"name": "ping"}},
             {"type": "function", "function": {"name": "anything", "parameters": {}}},
             {"type": "function", "function": {"name": "pong", "parameters": None}}]
    seen = 0
    for seed in range(6):
        status, r = server.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Ping?"}], "tools": loose,
            "tool_choice": "required", "temperature": 1.0, "seed": seed, "max_tokens": 64})
        assert status == 200, (status, r)
        c = r["choices"][0]
        calls = calls_of(c["message"])
        assert calls and all(name in ("ping", "anything", "pong") for name, _ in calls), c
        if c["finish_reason"] == "tool_calls":
            assert all(isinstance(json.loads(arguments), dict) for _, arguments in calls), calls
            seen += 1
    assert seen >= 1, "no answer without parameters ended within max_tokens"


def fallbacks(server):
    """/metrics' peerserve:forced_tool_call_fallbacks_total by its constraint label."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=30) as r:
        text = r.read().decode()
    found = {}
    for line in text.splitlines():
        m = re.match(r'peerserve:forced_tool_call_fallbacks_total\{.*constraint="(\w+)"\} (\S+)$',
                     line)
        if m:
            found[m.group(1)] = float(m.group(2))
    assert set(found) == {"any_object", "none"}, text
    return found


def forced_tool_call_fallbacks(server):
    """A tool with `"parameters": {}` beside one with a schema leaves that schema in force (it
    used to turn into "any value", over the automaton's bounds, and every tool fell back to
    any JSON object). Schemas whose patterns are together larger than the automaton takes
    fall back to any JSON object without building them (128 of these made a 220 MB pattern)."""
    before = fallbacks(server)
    mixed = [TOOLS[0], {"type": "function", "function": {"name": "anything", "parameters": {}}}]
    ended = 0
    for seed in range(4):
        status, r = server.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": mixed,
            "tool_choice": "required", "parallel_tool_calls": False, "temperature": 1.0,
            "seed": seed, "max_tokens": 96})
        assert status == 200, (status, r)
        c = r["choices"][0]
        if c["finish_reason"] != "tool_calls":
            continue
        ended += 1
        for call in c["message"]["tool_calls"]:
            name, arguments = call["function"]["name"], json.loads(call["function"]["arguments"])
            assert name in ("get_weather", "anything") and isinstance(arguments, dict), call
            if name == "get_weather":
                jsonschema.validate(arguments, WEATHER)
    assert ended >= 1, "no forced answer ended within max_tokens"
    assert fallbacks(server) == before, (fallbacks(server), before)
    # Each schema converts to a regex of ~0.8 MB (four properties that refer back to the
    # whole schema, expanded to the converter's depth); three are over the 1 MiB budget.
    recursive = [{"type": "function", "function": {"name": f"deep_{i}", "parameters": {
        "type": "object", "properties": {**{f"p{j}": {"$ref": "#"} for j in range(4)},
                                         f"v{i}": {"type": "integer"}}}}} for i in range(3)]
    status, r = server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Go."}], "tools": recursive,
        "tool_choice": "required", "temperature": 1.0, "seed": 1, "max_tokens": 48})
    assert status == 200, (status, r)
    c = r["choices"][0]
    if c["finish_reason"] == "tool_calls":
        for call in c["message"]["tool_calls"]:
            assert call["function"]["name"] in ("deep_0", "deep_1", "deep_2"), call
            assert isinstance(json.loads(call["function"]["arguments"]), dict), call
    after = fallbacks(server)
    assert after == {"any_object": before["any_object"] + 1, "none": before["none"]}, after


def run(server):
    def guided_choice():
        for seed in range(4):
            r = completion(server, {"guided_choice": CHOICES}, temperature=1.0, seed=seed, n=4)
            for c in r["choices"]:
                assert c["text"] in CHOICES, c["text"]
                assert c["finish_reason"] == "stop", c
        # structured_outputs' form, chat endpoint.
        r = chat(server, {"structured_outputs": {"choice": CHOICES}}, temperature=1.0, seed=9)
        assert r["choices"][0]["message"]["content"] in CHOICES, r

    def guided_regex():
        for seed in range(6):
            r = completion(server, {"guided_regex": DATE}, temperature=1.0, seed=seed)
            text = r["choices"][0]["text"]
            assert re.fullmatch(DATE, text), text
            assert r["choices"][0]["finish_reason"] == "stop", r["choices"][0]
        greedy = completion(server, {"guided_regex": DATE}, temperature=0)["choices"][0]["text"]
        assert re.fullmatch(DATE, greedy), greedy
        status, chunks = server.post("/v1/completions",
                                     {"prompt": "The answer is", "max_tokens": 48,
                                      "guided_regex": DATE, "temperature": 0, "stream": True},
                                     stream=True)
        assert status == 200, chunks
        streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        assert streamed == greedy, (streamed, greedy)
        # Cut short: a prefix of some match, finish_reason length.
        r = completion(server, {"guided_regex": DATE}, temperature=0, max_tokens=2)
        text = r["choices"][0]["text"]
        assert r["choices"][0]["finish_reason"] == "length", r["choices"][0]
        # Position by position, the date's character classes (a prefix a completion can finish).
        classes = ["2", "0", "0123456789", "0123456789", "-", "01", "0123456789", "-", "0123",
                   "0123456789"]
        assert len(text) < len(classes) and all(ch in classes[i] for i, ch in enumerate(text)), text

    def guided_json():
        forms = [
            ("completions guided_json", lambda: completion(
                server, {"guided_json": SCHEMA}, temperature=1.0, seed=1, max_tokens=96)),
            ("completions guided_json as text", lambda: completion(
                server, {"guided_json": json.dumps(SCHEMA)}, temperature=0, max_tokens=96)),
            ("chat response_format json_schema", lambda: chat(
                server, {"response_format": {"type": "json_schema", "json_schema": {
                    "name": "person", "schema": SCHEMA, "strict": True}}}, temperature=0)),
            ("chat structured_outputs.json", lambda: chat(
                server, {"structured_outputs": {"json": SCHEMA}}, temperature=1.0, seed=4)),
        ]
        for name, call in forms:
            for attempt in range(2):
                r = call()
                c = r["choices"][0]
                text = c["text"] if "text" in c else c["message"]["content"]
                if c["finish_reason"] == "length":
                    continue  # the model rambled inside a string; the prefix is still checked below
                try:
                    jsonschema.validate(json.loads(text), SCHEMA)
                except (ValueError, jsonschema.ValidationError) as e:
                    raise AssertionError(f"{name}: {text!r}: {e}")
                break
            else:
                raise AssertionError(f"{name}: never finished within max_tokens: {text!r}")

    def json_object():
        # The shipped model often wanders inside a string until max_tokens (16 of these 24
        # answers); every answer that ends on its own must be an object, and some must.
        finished = 0
        for seed in range(24):
            r = chat(server, {"response_format": {"type": "json_object"}}, temperature=1.0,
                     seed=seed, max_tokens=64)
            c = r["choices"][0]
            text = c["message"]["content"]
            assert text.startswith("{"), text
            if c["finish_reason"] == "stop":
                assert isinstance(json.loads(text), dict), text
                finished += 1
        print(f"json_object: {finished} of 24 answers ended within 64 tokens")
        assert finished >= 2, f"only {finished} of 24 answers ended within 64 tokens"

    def refusals():
        bad = [
            ({"guided_regex": "a(?=b)"}, "guided_regex"),
            ({"guided_regex": "[z-a]"}, "guided_regex"),
            ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
            ({"guided_grammar": "root ::= \"a\""}, "guided_grammar"),
            ({"guided_json": {"type": "string", "not": {"const": "a"}}}, "guided_json"),
            ({"guided_choice": []}, "guided_choice"),
            ({"guided_choice": ["a", 1]}, "guided_choice"),
            ({"response_format": {"type": "yaml"}}, "response_format"),
            ({"structured_outputs": {"grammar": "x"}}, "structured_outputs"),
        ]
        for extra, field in bad:
            status, r = server.post("/v1/completions", {"prompt": "x", "max_tokens": 4, **extra})
            assert status == 400, (extra, status, r)
            assert r["error"]["param"] == field, (extra, r)
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        status, r = server.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "tools": tools,
            "guided_regex": "a+", "max_tokens": 4})
        assert status == 400 and r["error"]["param"] == "guided_regex", (status, r)
        status, r = server.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "tools": tools,
            "tool_choice": "none", "guided_regex": "a+", "max_tokens": 4})
        assert status == 200 and re.fullmatch("a+", r["choices"][0]["message"]["content"]), r

    def bad_words():
        def tokenize(text):
            status, r = server.post("/tokenize", {"prompt": text, "add_special_tokens": False})
            assert status == 200, r
            return r["tokens"]

        def contains(ids, seq):
            return any(ids[i:i + len(seq)] == seq for i in range(len(ids) - len(seq) + 1))

        plain = completion(server, {}, temperature=0, max_tokens=24, return_token_ids=True)
        text = plain["choices"][0]["text"]
        words = re.findall(r"[A-Za-z]{3,}", text)
        assert words, text
        banned_sequences = []
        for word in words[:2]:
            alone, spaced = tokenize(word), tokenize(" " + word)
            banned_sequences.append(alone)
            if spaced[0] != alone[0] and len(spaced) == len(alone):
                banned_sequences.append(spaced)
        assert any(contains(plain["choices"][0]["token_ids"], seq) for seq in banned_sequences), \
            (text, banned_sequences)
        r = completion(server, {"bad_words": words[:2]}, temperature=0, max_tokens=24,
                       return_token_ids=True)
        ids = r["choices"][0]["token_ids"]
        assert not any(contains(ids, seq) for seq in banned_sequences), \
            (r["choices"][0]["text"], banned_sequences)
        assert r["choices"][0]["text"] != text

    case("guided_choice: every answer is a choice", guided_choice)
    case("guided_regex: full matches, streamed equal, cut short a prefix", guided_regex)
    case("guided_json and json_schema: answers validate", guided_json)
    case("response_format json_object: an object", json_object)
    case("refusals name the field", refusals)
    case("bad_words: the banned sequences are gone", bad_words)
    case("forced tool calls (named, required): arguments validate", lambda: forced_tool_calls(server))
    case("forced tool calls: {} keeps the others' schemas, oversized schemas fall back",
         lambda: forced_tool_call_fallbacks(server))


def main():
    server = start_server()
    try:
        run(server)
        greedy = {k: completion(server, v, temperature=0, max_tokens=64)["choices"][0]["text"]
                  for k, v in [("regex", {"guided_regex": DATE}), ("json", {"guided_json": SCHEMA})]}
    finally:
        server.stop()
    speculative = start_server("--speculative", "mtp")
    try:
        def same_under_speculation():
            for k, v in [("regex", {"guided_regex": DATE}), ("json", {"guided_json": SCHEMA})]:
                got = completion(speculative, v, temperature=0, max_tokens=64)["choices"][0]["text"]
                assert got == greedy[k], (k, got, greedy[k])
        case("--speculative mtp: the same greedy answers under a constraint", same_under_speculation)
    finally:
        speculative.stop()
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
