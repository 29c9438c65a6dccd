"""serve_tools_v3.py - tool calls with DeepSeek-V3's chat template, live:
a tiny deepseek2 made here (ecs-mkmodel --chat-template, --special-tokens)
whose template is V3's and whose vocabulary has V3's tool markup as
control tokens. Past calls and results reach the model as V3's template
renders them, the markup as those control tokens (usage against /tokenize
of the expected text); a forced call (its random weights constrained by
JSON mode) comes back as the named function's call with arguments that
follow its schema, in both APIs, whole and streamed; a choice among
several tools, which V3's form cannot constrain, is a 400 naming the fix.
The server is started here and stopped by pid.
usage: serve_tools_v3.py ROOT BUILD"""
import json
import os
import subprocess
import sys
import tempfile

from serve_lib import Server, post_json, request, run_check, sse_events

root, build = sys.argv[1], sys.argv[2]
binary = "%s/%s/bin/ecs-coordinator" % (root, build)
fails = 0

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
MARKUP = ["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
          "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>",
          "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"]
# the shape of DeepSeek-V3's template (what tok_chat_detect recognises)
TEMPLATE = ("{{bos_token}}{%- for message in messages %}{%- if message['role'] == 'user' %}"
            "{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == "
            "'assistant' %}{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}"
            "{%- endif %}{%- endfor -%}{% if add_generation_prompt %}{{'<｜Assistant｜>'}}{% endif %}")
UNIT = {"type": "object", "additionalProperties": False, "required": ["unit", "days"],
        "properties": {"unit": {"enum": ["c", "f"]},
                       "days": {"type": "integer"}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                            "parameters": UNIT}}
OTHER = {"type": "function", "function": {"name": "b"}}


def n_tokens(text, parse_special=True):
    st, r = post_json(srv.port, "/tokenize", {"content": text, "add_special": False,
                                              "parse_special": parse_special})
    assert st == 200, r
    return len(r["tokens"])


def history():
    """Past calls and results: the prompt is V3's rendering, its markup
    control tokens, and the answer follows the results directly."""
    msgs = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"unit\": \"c\", \"days\": 1}"}},
                {"id": "2", "type": "function", "function": {"name": "b", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "2", "content": "ok"}]
    want = (USER + "Weather?" + ASSISTANT + MARKUP[0] + MARKUP[2] + "function" + MARKUP[4] +
            "get_weather\n```json\n{\"unit\": \"c\", \"days\": 1}\n```" + MARKUP[3] + "\n" +
            MARKUP[2] + "function" + MARKUP[4] + "b\n```json\n{}\n```" + MARKUP[3] + MARKUP[1] +
            EOS + MARKUP[5] + MARKUP[7] + "sunny" + MARKUP[8] + "\n" + MARKUP[7] + "ok" +
            MARKUP[8] + MARKUP[6])
    st, r = post_json(srv.port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 1})
    assert st == 200, r
    n = r["usage"]["prompt_tokens"]
    assert n == 1 + n_tokens(want), (n, n_tokens(want))  # + BOS
    assert n_tokens(want, False) > n_tokens(want) + 20, "the markup is not control tokens"
    # the same conversation through the Anthropic API
    an = [{"role": "user", "content": "Weather?"},
          {"role": "assistant", "content": [
              {"type": "tool_use", "id": "1", "name": "get_weather", "input": {"unit": "c", "days": 1}},
              {"type": "tool_use", "id": "2", "name": "b", "input": {}}]},
          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "1", "content": "sunny"},
                                       {"type": "tool_result", "tool_use_id": "2", "content": "ok"}]}]
    st, r = post_json(srv.port, "/v1/messages/count_tokens", {"messages": an})
    assert st == 200 and r["input_tokens"] == n, (st, r, n)


def check_args(args):
    a = json.loads(args)
    assert set(a) == {"unit", "days"} and a["unit"] in ("c", "f") and type(a["days"]) is int, a


def forced():
    """A call forced by name: the named function, its schema's arguments."""
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER, OTHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": 300, "temperature": 0}
    st, r = post_json(srv.port, "/v1/chat/completions", body)
    assert st == 200, r
    c = r["choices"][0]
    assert c["finish_reason"] == "tool_calls" and c["message"]["content"] is None, c
    (call,) = c["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather", call
    check_args(call["function"]["arguments"])
    st, _, b = request(srv.port, "POST", "/v1/chat/completions", dict(body, stream=True))
    assert st == 200, b[:300]
    deltas = [d["choices"][0]["delta"] for _, d in sse_events(b)
              if isinstance(d, dict) and d.get("choices")]
    calls = [t for d in deltas for t in d.get("tool_calls") or []]
    assert calls and calls[0]["function"]["name"] == "get_weather", deltas
    assert "".join(t["function"].get("arguments", "") for t in calls) == call["function"]["arguments"]
    an = {"max_tokens": 300, "temperature": 0, "messages": [{"role": "user", "content": "hi"}],
          "tools": [{"name": "get_weather", "input_schema": UNIT}],
          "tool_choice": {"type": "any"}}  # a single tool: that one
    st, r = post_json(srv.port, "/v1/messages", an)
    assert st == 200 and r["stop_reason"] == "tool_use", r
    use = [b for b in r["content"] if b["type"] == "tool_use"]
    assert len(use) == 1 and use[0]["name"] == "get_weather", r["content"]
    check_args(json.dumps(use[0]["input"]))


def auto_text():
    """tool_choice auto: the random model writes text, which stays text."""
    st, r = post_json(srv.port, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER], "max_tokens": 8,
        "temperature": 0})
    assert st == 200, r
    c = r["choices"][0]
    assert "tool_calls" not in c["message"] and isinstance(c["message"]["content"], str), c
    # the markup is control tokens, yet reaches the output to be read: a
    # model pushed to write the calls' opening (and nothing after it)
    st, r = post_json(srv.port, "/tokenize", {"content": MARKUP[0], "parse_special": True})
    (tid,) = r["tokens"]
    st, r = post_json(srv.port, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER], "max_tokens": 3,
        "temperature": 0, "logit_bias": {str(tid): 100}})
    assert st == 200, r
    c = r["choices"][0]
    assert c["message"]["content"] == MARKUP[0] * 3 and "tool_calls" not in c["message"], c
    # only the calls' markup does (llama-server's preserved tokens): another
    # control token the model writes stays out of the text
    st, r = post_json(srv.port, "/tokenize", {"content": MARKUP[5], "parse_special": True})
    (oid,) = r["tokens"]
    st, r = post_json(srv.port, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER], "max_tokens": 3,
        "temperature": 0, "logit_bias": {str(oid): 100}})
    assert st == 200 and r["usage"]["completion_tokens"] == 3, r
    assert not r["choices"][0]["message"]["content"], r["choices"][0]


def system_tools():
    """The tools list joins the system turn as llama-server's rendering puts
    it, its example call's markup control tokens; markup the client typed in
    its system message stays text."""
    sys_text = "S " + MARKUP[4]
    head = ("You can call any of the following tools to satisfy the user's requests: " +
            json.dumps([WEATHER], indent=2, ensure_ascii=False) + "\n\nExample tool call syntax:\n\n")
    example = (MARKUP[0] + MARKUP[2] + "function" + MARKUP[4] + "tool_name\n```json\n"
               "{\"arg1\": \"some_value\"}\n```" + MARKUP[3] + MARKUP[1])
    plain = sys_text + "\n\n" + head  # one plain run up to the example's first control token
    want = 1 + n_tokens(plain, False) + n_tokens(example + "\n\n" + USER + "Weather?" + ASSISTANT)
    msgs = [{"role": "system", "content": sys_text}, {"role": "user", "content": "Weather?"}]
    st, r = post_json(srv.port, "/v1/chat/completions", {"messages": msgs, "tools": [WEATHER],
                                                          "max_tokens": 1})
    assert st == 200 and r["usage"]["prompt_tokens"] == want, (r.get("usage"), want)
    assert n_tokens(example, False) > n_tokens(example) + 10, "the example is not control tokens"
    an = {"system": sys_text, "messages": [{"role": "user", "content": "Weather?"}],
          "tools": [{"name": "get_weather", "description": "Weather", "input_schema": UNIT}]}
    st, r = post_json(srv.port, "/v1/messages/count_tokens", an)
    assert st == 200 and r["input_tokens"] == want, (st, r, want)


def choice_among_several():
    for path, body in (
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                      "tools": [WEATHER, OTHER], "tool_choice": "required"}),
            ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
                              "tools": [{"name": "a", "input_schema": {}},
                                        {"name": "b", "input_schema": {}}],
                              "tool_choice": {"type": "any"}})):
        st, r = post_json(srv.port, path, body)
        assert st == 400 and "name the function" in r["error"]["message"], (st, r)


def clean_exit():
    assert srv.stop() == 0, "exit status %s" % srv.proc.returncode


with tempfile.TemporaryDirectory() as tmp:
    tmpl, model = os.path.join(tmp, "v3.jinja"), os.path.join(tmp, "v3.gguf")
    with open(tmpl, "w") as f:
        f.write(TEMPLATE)
    subprocess.check_call([os.path.join(root, build, "bin", "ecs-mkmodel"), "--arch", "deepseek2",
                           "--preset", "tiny", "--types", "q8_0", "--seed", "1", "--threads", "1",
                           "--vocab-size", "4096", "--chat-template", tmpl, "--special-tokens",
                           ",".join([USER, ASSISTANT] + MARKUP), "-o", model], cwd=root)
    srv = Server(binary, model, "--ctx", "1024", "--no-prefix-cache")
    for name, fn in (("past calls and results: V3's rendering, its markup control tokens (both APIs)",
                      history),
                     ("a forced call: the function named, arguments following its schema (both APIs, "
                      "streamed)", forced),
                     ("tool_choice auto: text stays text, only the calls' control tokens show",
                      auto_text),
                     ("the tools list in the system turn: its example's markup control tokens, "
                      "the client's text plain (both APIs)", system_tools),
                     ("a forced choice among several tools -> 400 naming the fix", choice_among_several),
                     ("clean exit", clean_exit)):
        fails += not run_check(name, fn)
    if srv.proc.poll() is None:
        srv.stop()
print("%d failed" % fails if fails else "all passed")
sys.exit(1 if fails else 0)
