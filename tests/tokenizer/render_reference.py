"""Independent reference for the chat-template tests: renders templates with jinja2 the
way transformers' apply_chat_template does (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, raise_exception, strftime_now, tojson with ensure_ascii=False).

usage: /usr/bin/python3 render_reference.py REQUEST.json RESPONSE.json
request:  [{"template": str, "variables": {...}}, ...]
response: [{"ok": true, "text": str} | {"ok": false, "error": str}, ...]
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def render(template, variables):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template).render(**variables)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    results = []
    for case in cases:
        try:
            results.append({"ok": True, "text": render(case["template"], case["variables"])})
        except Exception as e:  # the test only needs to know that it failed
            results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
