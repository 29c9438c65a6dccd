"""serve_reasoning.py - reasoning with a chat template that thinks, live:
a tiny qwen3moe made here (ecs-mkmodel --chat-template) with a template
whose assistant prompt opens the think block (as Qwen3's thinking-only
models' do). Its weights are random, so it never writes "</think>" and all
of its answer is reasoning (the split after "</think>" is test_api_reasoning's):
thinking off appends the empty think block to the prompt (usage against
/tokenize); thinking on puts the answer, the raw completion of the same
prompt, in reasoning_content / an Anthropic thinking block, whole and
streamed alike; a thinking budget ends the reasoning there (the server
writes "</think>" for the model) and the model answers (Anthropic's
thinking.budget_tokens, OpenAI's thinking_budget_tokens, a server's
--reasoning-budget for requests naming none); thinking off leaves it in
content; mistakes get a 400.
The server is started here and stopped by pid.
usage: serve_reasoning.py ROOT BUILD"""
import json
import os
import subprocess
import sys
import tempfile

from serve_lib import Server, post_json, request, run_check, sse_events

root, build = sys.argv[1], sys.argv[2]
binary = "%s/%s/bin/ecs-coordinator" % (root, build)
fails = 0

# ChatML that opens the think block in its assistant prompt (Qwen3's
# thinking-only models); HYBRID: Qwen3's hybrid, "<think>" only where
# enable_thinking is false (its model writes "<think>" itself)
TEMPLATE = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
            "message.content + '<|im_end|>\\n' }}{%- endfor %}\n{%- if add_generation_prompt %}"
            "{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}\n")
HYBRID = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
          "message.content + '<|im_end|>\\n' }}{%- endfor %}\n{%- if add_generation_prompt %}"
          "{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking "
          "is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}\n")
PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
EMPTY = "<think>\n\n</think>\n\n"
OPEN = "<think>\n"
MSGS = [{"role": "user", "content": "hi"}]


def n_tokens(text):
    st, r = post_json(srv.port, "/tokenize", {"content": text, "add_special": True,
                                              "parse_special": False})
    assert st == 200, r
    return len(r["tokens"])


def raw(prompt, n):
    st, r = post_json(srv.port, "/v1/completions", {"prompt": prompt, "max_tokens": n,
                                                    "temperature": 0, "ignore_eos": True})
    assert st == 200, r
    return r["choices"][0]["text"]


def generate(path, n, stream=False, **kw):
    body = dict({"messages": MSGS, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                 "stream": stream}, **kw)
    st, h, b = request(srv.port, "POST", path, body)
    assert st == 200, b[:300]
    return sse_events(b) if stream else json.loads(b)


def chat(n, stream=False, **kw):
    return generate("/v1/chat/completions", n, stream, **kw)


def anthropic(n, stream=False, **kw):
    return generate("/v1/messages", n, stream, **kw)


def prompt_ends():
    for kw, suffix in (({}, OPEN), ({"chat_template_kwargs": {"enable_thinking": True}}, OPEN),
                       ({"chat_template_kwargs": {"enable_thinking": False}}, EMPTY)):
        r = chat(1, **kw)
        assert r["usage"]["prompt_tokens"] == n_tokens(PROMPT + suffix), (kw, r["usage"])
    for kw, suffix in (({}, OPEN), ({"thinking": {"type": "disabled"}}, EMPTY),
                       ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, OPEN)):
        r = anthropic(1, **kw)
        assert r["usage"]["input_tokens"] == n_tokens(PROMPT + suffix), (kw, r["usage"])


def reasoning_out():
    want = raw(PROMPT + OPEN, 8).lstrip("\n")  # what a stream or a whole answer calls reasoning
    assert want and "</think>" not in want, want
    m = chat(8)["choices"][0]
    assert m["message"]["reasoning_content"] == want and m["message"]["content"] == "", m
    assert m["finish_reason"] == "length", m
    deltas = [d["choices"][0]["delta"] for _, d in chat(8, True) if isinstance(d, dict) and d.get("choices")]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == want, deltas
    assert "".join(d.get("content") or "" for d in deltas) == "", deltas
    r = anthropic(8)
    assert r["content"] == [{"type": "thinking", "thinking": want, "signature": ""},
                            {"type": "text", "text": ""}], r["content"]
    evs = [d for _, d in anthropic(8, True) if isinstance(d, dict)]
    starts = [(d["index"], d["content_block"]["type"]) for d in evs if d["type"] == "content_block_start"]
    assert starts == [(0, "thinking"), (1, "text")], starts
    thought = "".join(d["delta"]["thinking"] for d in evs if d["type"] == "content_block_delta"
                      and d["delta"]["type"] == "thinking_delta" and d["index"] == 0)
    assert thought == want, (thought, want)
    stops = [d["index"] for d in evs if d["type"] == "content_block_stop"]
    assert stops == [0, 1], stops


def budget():
    """thinking.budget_tokens: after that many tokens of reasoning the
    server writes the think block's end and the model answers; a budget
    not reached changes nothing."""
    want = raw(PROMPT + OPEN, 4).strip("\n")
    for stream in (False, True):
        kw = {"thinking": {"type": "enabled", "budget_tokens": 4}}
        if not stream:
            r = anthropic(16, **kw)
            thought, text = r["content"][0]["thinking"], r["content"][1]["text"]
            assert [b["type"] for b in r["content"]] == ["thinking", "text"], r
            assert r["usage"]["output_tokens"] == 16 and r["stop_reason"] == "max_tokens", r
        else:
            evs = [d for _, d in anthropic(16, True, **kw) if isinstance(d, dict)]
            thought = "".join(d["delta"].get("thinking", "") for d in evs
                              if d["type"] == "content_block_delta" and d["index"] == 0)
            text = "".join(d["delta"].get("text", "") for d in evs
                           if d["type"] == "content_block_delta" and d["index"] == 1)
        assert thought == want, (thought, want)
        assert text and "</think>" not in text, text
    r = anthropic(8, thinking={"type": "enabled", "budget_tokens": 100})
    assert r["content"][0]["thinking"] == raw(PROMPT + OPEN, 8).lstrip("\n"), r


def chat_split(n, stream=False, **kw):
    """An OpenAI chat answer's reasoning_content and content, whole or streamed."""
    if not stream:
        m = chat(n, **kw)["choices"][0]["message"]
        return m.get("reasoning_content") or "", m["content"] or ""
    deltas = [d["choices"][0]["delta"] for _, d in chat(n, True, **kw)
              if isinstance(d, dict) and d.get("choices")]
    return ("".join(d.get("reasoning_content") or "" for d in deltas),
            "".join(d.get("content") or "" for d in deltas))


def openai_budget():
    """thinking_budget_tokens (llama-server's field) on the OpenAI route: N
    tokens of reasoning then the model answers, 0 ends the reasoning at
    once, -1 is no budget; whole and streamed alike."""
    want = raw(PROMPT + OPEN, 4).strip("\n")
    for stream in (False, True):
        thought, text = chat_split(16, stream, thinking_budget_tokens=4)
        assert thought == want and text and "</think>" not in text, (stream, thought, want, text)
        thought, text = chat_split(24, stream, thinking_budget_tokens=0)
        assert thought == "" and text and "</think>" not in text, (stream, thought, text)
    assert chat_split(8, thinking_budget_tokens=-1) == (raw(PROMPT + OPEN, 8).lstrip("\n"), "")


def server_budget():
    """--reasoning-budget 4: a request that names no budget stops reasoning
    after 4 tokens (both APIs); one that names its own keeps it."""
    want = raw(PROMPT + OPEN, 4).strip("\n")
    thought, text = chat_split(16)
    assert thought == want and text and "</think>" not in text, (thought, want, text)
    r = anthropic(16)
    assert r["content"][0]["thinking"] == want and r["content"][1]["text"], r["content"]
    full = raw(PROMPT + OPEN, 8).lstrip("\n")
    assert chat_split(8, thinking_budget_tokens=-1) == (full, "")
    r = anthropic(8, thinking={"type": "enabled", "budget_tokens": 100})
    assert r["content"][0]["thinking"] == full, r["content"]


def thinking_off_is_content():
    want = raw(PROMPT + EMPTY, 8)
    m = chat(8, chat_template_kwargs={"enable_thinking": False})["choices"][0]["message"]
    assert m["content"] == want and "reasoning_content" not in m, m
    r = anthropic(8, thinking={"type": "disabled"})
    assert r["content"] == [{"type": "text", "text": want}], r


def hybrid_no_think_is_content():
    """Qwen3's hybrid template: the prompt ends as before, and an answer
    that does not open a think block (random weights never do) is content,
    whole and streamed; Anthropic's reply then has no thinking block."""
    r = chat(8)
    assert r["usage"]["prompt_tokens"] == n_tokens(PROMPT), r["usage"]
    want = raw(PROMPT, 8)
    m = r["choices"][0]["message"]
    assert m["content"] == want and "reasoning_content" not in m, m
    deltas = [d["choices"][0]["delta"] for _, d in chat(8, True) if isinstance(d, dict) and d.get("choices")]
    assert "".join(d.get("content") or "" for d in deltas) == want, deltas
    assert not any(d.get("reasoning_content") for d in deltas), deltas
    b = anthropic(8, thinking={"type": "enabled", "budget_tokens": 2})  # no block: no budget
    assert b["content"] == [{"type": "text", "text": want}], b["content"]
    a = anthropic(8)  # no thinking block: the answer opened none
    assert a["content"] == [{"type": "text", "text": want}], a["content"]
    evs = [d for _, d in anthropic(8, True) if isinstance(d, dict)]
    starts = [(d["index"], d["content_block"]["type"]) for d in evs if d["type"] == "content_block_start"]
    assert starts == [(0, "text")], starts
    text = "".join(d["delta"]["text"] for d in evs if d["type"] == "content_block_delta")
    assert text == want and [d["index"] for d in evs if d["type"] == "content_block_stop"] == [0], evs


def mistakes():
    for path, body, needle in (
            ("/v1/chat/completions", {"messages": MSGS, "chat_template_kwargs": 5},
             "'chat_template_kwargs' must be an object"),
            ("/v1/chat/completions", {"messages": MSGS, "chat_template_kwargs": {"enable_thinking": "no"}},
             "enable_thinking must be a boolean"),
            ("/v1/messages", {"messages": MSGS, "max_tokens": 4, "thinking": {"type": "enabled"}},
             "budget_tokens must be a positive integer"),
            ("/v1/chat/completions", {"messages": MSGS, "thinking_budget_tokens": -2},
             "'thinking_budget_tokens' must be an integer"),
            ("/v1/chat/completions", {"messages": MSGS, "thinking_budget_tokens": "4"},
             "'thinking_budget_tokens' must be an integer")):
        st, r = post_json(srv.port, path, body)
        msg = r["error"]["message"]
        assert st == 400 and needle in msg, (st, r)


def bad_flag():
    """--reasoning-budget below -1 or not a number: a clear error, exit 2 (usage)."""
    for v in ("-2", "four", ""):
        p = subprocess.run([binary, "-m", "unused.gguf", "--reasoning-budget", v],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and "--reasoning-budget: bad value '%s'" % v in p.stderr, (v, p)


def serve(tmp, name, template, *args):
    """A tiny qwen3moe with this chat template, served."""
    tmpl, model = os.path.join(tmp, name + ".jinja"), os.path.join(tmp, name + ".gguf")
    with open(tmpl, "w") as f:
        f.write(template)
    subprocess.check_call([os.path.join(root, build, "bin", "ecs-mkmodel"), "--arch", "qwen3moe",
                           "--preset", "tiny", "--types", "q8_0", "--seed", "1", "--threads", "1",
                           "--chat-template", tmpl, "-o", model], cwd=root)
    return Server(binary, model, "--ctx", "512", "--no-prefix-cache", *args)


def clean_exit():
    assert srv.stop() == 0, "exit status %s" % srv.proc.returncode


with tempfile.TemporaryDirectory() as tmp:
    for name, template, args, checks in (
            ("think", TEMPLATE, [],
             [("thinking off ends the prompt with the empty think block (both APIs)", prompt_ends),
              ("thinking on: the answer is reasoning_content / a thinking block, whole and "
               "streamed", reasoning_out),
              ("thinking.budget_tokens: the think block ends there, the model answers "
               "(whole and streamed)", budget),
              ("thinking_budget_tokens on the OpenAI route: N, 0 and -1 (whole and "
               "streamed)", openai_budget),
              ("thinking off: the answer is content", thinking_off_is_content),
              ("bad thinking fields -> 400 naming them", mistakes),
              ("clean exit", clean_exit)]),
            ("hybrid", HYBRID, [],
             [("hybrid template: an answer without a think block is content",
               hybrid_no_think_is_content),
              ("hybrid server: clean exit", clean_exit)]),
            ("budget", TEMPLATE, ["--reasoning-budget", "4"],
             [("--reasoning-budget 4: requests naming no budget stop reasoning there, those "
               "naming one keep theirs (both APIs)", server_budget),
              ("--reasoning-budget with a bad value -> exit 2 naming it", bad_flag),
              ("budget server: clean exit", clean_exit)])):
        srv = serve(tmp, name, template, *args)
        for check, fn in checks:  # each one reported, the server stopped by the last
            fails += not run_check(check, fn)
        if srv.proc.poll() is None:
            srv.stop()
print("%d failed" % fails if fails else "all passed")
sys.exit(1 if fails else 0)
