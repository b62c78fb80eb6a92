// The Jinja interpreter against PyPI's jinja2, set up as transformers sets it up for chat
// templates (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls, its
// tojson, raise_exception and strftime_now): the same text, or an error on both sides, for
// chat templates in the forms Llama 2, Llama 3, Llama 3.1, ChatML and Mistral use and for
// every statement, filter, test, method and operator the interpreter implements. Skips when
// python3 cannot import jinja2 (pip install jinja2).
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/jinja.h"
#include "testing/shared_data.h"

namespace shardtrain::data::jinja {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kScript = R"PY(
import json, sys
from datetime import datetime
import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols, Extension
from jinja2 import nodes

class Generation(Extension):
    # transformers' AssistantTracker without the tracking: the block's body as it is
    tags = {"generation"}
    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)
    def _render(self, caller):
        return caller()

def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def strftime_now(fmt):
    return datetime(2024, 7, 26, 9, 5, 3).strftime(fmt)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now
out = []
for case in json.load(open(sys.argv[1], encoding="utf-8")):
    try:
        out.append({"ok": True, "text": env.from_string(case["template"]).render(**case["context"])})
    except Exception as e:
        out.append({"ok": False, "error": type(e).__name__ + ": " + str(e)})
json.dump(out, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
)PY";

bool python_has_jinja2() { return std::system("python3 -c 'import jinja2' > /dev/null 2>&1") == 0; }

struct Case {
  std::string name, template_text;
  json context;
};

// raise_exception and strftime_now as the harness defines them (a fixed moment).
Value with_functions(const json& context) {
  Value v = Value::from_json(context);
  v.mutable_entries().set("raise_exception", Value::function("raise_exception", [](Call& c) -> Value {
    ST_THROW("raise_exception: ", to_python_string(c.arg(0, "message")));
  }));
  v.mutable_entries().set("strftime_now", Value::function("strftime_now", [](Call& c) {
    std::tm t{};
    t.tm_year = 2024 - 1900;
    t.tm_mon = 6;
    t.tm_mday = 26;
    t.tm_hour = 9;
    t.tm_min = 5;
    t.tm_sec = 3;
    t.tm_wday = 5;
    t.tm_yday = 207;
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, c.arg(0, "format").str().c_str(), &t);
    return Value::string(std::string(buf, n));
  }));
  return v;
}

const json kConversation = json::parse(R"([
  {"role": "system", "content": "  You are terse.\n"},
  {"role": "user", "content": "Hello, who are you?  "},
  {"role": "assistant", "content": "\n I am a model. "},
  {"role": "user", "content": "Name three colors: 'red', \"green\" — and ünïcödé ✓."}
])");

// Templates of our own writing that produce the turn formats of Llama 2 ([INST] with a
// <<SYS>> block), ChatML (Qwen2), Mistral ([INST], the system text in the last user turn) and
// Llama 3.1 (a dated system header, tools as JSON, tool calls and their results), each
// exercising the statements and filters such templates use.
const char* const kLlama2 = R"({%- set has_system = messages | length > 0 and messages[0].role == 'system' -%}
{%- set turns = messages[1:] if has_system else messages -%}
{%- for turn in turns -%}
  {%- set expect_user = loop.index0 is even -%}
  {%- if (turn.role == 'user') != expect_user -%}
    {{ raise_exception('turns must go user, assistant, user, ...') }}
  {%- endif -%}
  {%- set text = turn.content -%}
  {%- if loop.first and has_system -%}
    {%- set text = '<<SYS>>\n' ~ messages[0].content ~ '\n<</SYS>>\n\n' ~ text -%}
  {%- endif -%}
  {%- if turn.role == 'user' -%}
    {{ bos_token }}[INST] {{ text.strip() }} [/INST]
  {%- else -%}
    {{ ' ' ~ text.strip() ~ ' ' ~ eos_token }}
  {%- endif -%}
{%- endfor -%})";

const char* const kChatMl = R"({% set ns = namespace(system_seen=false) %}
{% for m in messages %}
{% if m['role'] == 'system' %}{% set ns.system_seen = true %}{% endif %}
{% if loop.first and not ns.system_seen %}
<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}
<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %})";

const char* const kMistral = R"({%- macro inst(body) -%}[INST] {{ body }}[/INST]{%- endmacro -%}
{%- if messages[0]['role'] == 'system' -%}
  {%- set sys = messages[0]['content'] -%}
  {%- set rest = messages[1:] -%}
{%- else -%}
  {%- set rest = messages -%}
{%- endif -%}
{{ bos_token }}
{%- for m in rest -%}
  {%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{ raise_exception('roles must alternate after the optional system message') }}
  {%- elif m['role'] == 'user' -%}
    {{ inst(sys ~ '\n\n' ~ m['content'] if loop.last and sys is defined else m['content']) }}
  {%- elif m['role'] == 'assistant' -%}
    {{ ' ' ~ m['content'] | trim ~ eos_token }}
  {%- else -%}
    {{ raise_exception('unknown role ' ~ m['role']) }}
  {%- endif -%}
{%- endfor -%}
)";

const char* const kLlama31Like = R"({{- bos_token -}}
{%- set today = date_string if date_string is defined else strftime_now('%d %b %Y') -%}
{%- set tool_list = custom_tools if custom_tools is defined else tools -%}
{%- set in_user = tools_in_user_message if tools_in_user_message is defined else true -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set preamble = messages[0].content | trim -%}
  {%- set messages = messages[1:] -%}
{%- else -%}
  {%- set preamble = '' -%}
{%- endif -%}
{#- the system header: environment, dates, tools -#}
<|start_header_id|>system<|end_header_id|>{{ '\n\n' }}
{%- if tool_list is not none %}Environment: ipython{{ '\n' }}{% endif -%}
Cutting Knowledge Date: December 2023{{ '\n' }}Today Date: {{ today }}{{ '\n\n' }}
{%- if tool_list is not none and not in_user -%}
  You have access to the following functions.{{ '\n\n' }}
  {%- for t in tool_list -%}{{ t | tojson(indent=4) }}{{ '\n\n' }}{%- endfor -%}
{%- endif -%}
{{ preamble }}<|eot_id|>
{%- for m in messages -%}
  {%- if m.role in ['ipython', 'tool'] -%}
    <|start_header_id|>ipython<|end_header_id|>{{ '\n\n' }}
    {{- m.content | tojson if m.content is mapping or m.content is sequence and m.content is not string
        else m.content -}}
    <|eot_id|>
  {%- elif 'tool_calls' in m -%}
    {%- if m.tool_calls | length != 1 -%}{{ raise_exception('one tool call at a time') }}{%- endif -%}
    {%- set call = m.tool_calls[0].function -%}
    <|start_header_id|>assistant<|end_header_id|>{{ '\n\n' }}{"name": "{{ call.name }}", "parameters": {{
      call.arguments | tojson }}}<|eot_id|>
  {%- else -%}
    <|start_header_id|>{{ m.role }}<|end_header_id|>{{ '\n\n' }}{{ m.content | trim }}<|eot_id|>
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|start_header_id|>assistant<|end_header_id|>{{ '\n\n' }}{%- endif -%}
)";

std::vector<Case> cases() {
  std::vector<Case> out;
  const json base = {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"add_generation_prompt", true}};
  auto chat = [&](const std::string& name, const char* tmpl, json messages, json extra = json::object()) {
    json ctx = base;
    ctx["messages"] = std::move(messages);
    for (auto it = extra.begin(); it != extra.end(); ++it) ctx[it.key()] = it.value();
    out.push_back({name, tmpl, ctx});
  };
  const json conversation = kConversation;
  json no_system = conversation;
  no_system.erase(no_system.begin());
  json broken = no_system;
  broken.push_back({{"role", "user"}, {"content", "twice"}});
  for (const auto& [name, tmpl] : std::vector<std::pair<std::string, const char*>>{
           {"llama2", kLlama2}, {"chatml", kChatMl}, {"mistral", kMistral}, {"llama31", kLlama31Like}}) {
    chat(name + " with system", tmpl, conversation);
    chat(name + " without system", tmpl, no_system);
    chat(name + " one message", tmpl, json::array({no_system[0]}), {{"add_generation_prompt", false}});
    chat(name + " roles out of order", tmpl, broken);
  }
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "description":
      "Weather at a place", "parameters": {"type": "object", "properties": {"place": {"type": "string"},
      "days": {"type": "integer", "minimum": 1.5}}, "required": ["place"]}}}])");
  json with_tools = no_system;
  with_tools.push_back({{"role", "assistant"}, {"tool_calls", json::parse(R"([{"type": "function", "function":
      {"name": "get_weather", "arguments": {"place": "Paris", "days": 2, "flag": true, "none": null}}}])")}});
  with_tools.push_back({{"role", "tool"}, {"content", json::parse(R"({"temperature": 21.5, "unit": "°C"})")}});
  chat("llama31 tools in system", kLlama31Like, with_tools, {{"tools", tools}, {"tools_in_user_message", false}});
  chat("llama31 tools, string result", kLlama31Like,
       json::array({no_system[0], {{"role", "tool"}, {"content", "21 degrees"}}}), {{"tools", tools}});
  chat("llama31 fixed date", kLlama31Like, no_system, {{"date_string", "1 Jan 2025"}});

  // statements, whitespace control, scoping
  auto plain = [&](const std::string& name, const std::string& tmpl, json ctx = json::object()) {
    out.push_back({name, tmpl, ctx});
  };
  const json xs = {{"xs", {3, 1, 4, 1, 5}}, {"d", {{"b", 2}, {"a", 1}}}, {"s", "Hello, World"}, {"n", nullptr},
                   {"people",
                    json::parse(R"([{"name": "Ann", "age": 31}, {"name": "Bob"}, {"name": "Cy", "age": 7}])")}};
  plain("text only", "plain text\nwith lines\n");
  plain("trim and lstrip",
        "a\n  {% if true %}\n  b\n  {% endif %}\nc\n    {# comment #}\nd {% if true %}e{% endif %}\n");
  plain("minus and plus", "x   {{- ' y ' -}}   z\n  {%+ if true %}k{% endif +%}\nq {%- if true -%} \n r {%- endif %}");
  plain("for loop fields", "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/"
        "{{ loop.revindex0 }}"
        "/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem }}/{{ loop.nextitem }}"
        "/{{ loop.cycle('a', 'b', 'c') }};{% endfor %}", xs);
  plain("nested loops cycle", "{% for a in [1, 2] %}{% set outer = loop %}{% for b in [1, 2, 3] %}"
        "{{ loop.cycle('x', 'y') }}{{ outer.cycle('p', 'q') }}{% endfor %}{{ loop.cycle('r', 's', 't') }}|{% endfor %}");
  plain("for else, filter, break, continue", "{% for x in [] %}no{% else %}empty{% endfor %}|"
        "{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% endfor %}|"
        "{% for x in xs %}{% if x == 4 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}"
        "{% endfor %}",
        xs);
  plain("dict loops", "{% for k in d %}{{ k }}{% endfor %} {% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %} "
        "{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %} {{ d.keys() | list }} {{ d.values() | list }}", xs);
  plain("set scoping", "{% set a = 1 %}{% for x in xs %}{% set a = x %}{% endfor %}{{ a }} "
        "{% set ns = namespace(total=0, seen=[]) %}{% for x in xs %}{% set ns.total = ns.total + x %}{% endfor %}"
        "{{ ns.total }} {% set p, q = 1, 'two' %}{{ p }}{{ q }}"
        "{% set block %}in {{ a }} block{% endset %}[{{ block }}]",
        xs);
  plain("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
        "{{ greet('Ann') }} {{ greet('Bob', '?') }} {{ greet(name='Cy', punct='.') }}");
  plain("nested loops and loop vars", "{% for p in people %}{% for c in p.name %}{{ loop.index }}{{ c }}{% endfor %}"
        "({{ loop.index }}){% endfor %}", xs);
  plain("generation block", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
        "{% endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}", {{"messages", conversation}});

  // expressions
  plain("arithmetic", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} "
        "{{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }} {{ 1.5 + 1 }} {{ -3 }} {{ - -3 }} {{ 10 / 4 }} {{ 3.0 }} {{ 1e20 }} "
        "{{ 0.0001 }} {{ 1e-05 }} {{ 123456789.125 }} {{ 2.5 // 1 }} {{ 'ab' * 3 }} {{ [1, 2] * 2 }} {{ 1_000 }}");
  plain("comparisons and logic", "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ true == 1 }} "
        "{{ 'x' in 'xyz' }} {{ 'q' not in 'xyz' }} {{ 2 in xs }} {{ 'a' in d }} {{ none or 'dflt' }} {{ 0 and 5 }} "
        "{{ 3 and 5 }} {{ not [] }} {{ 'yes' if xs else 'no' }} {{ 'yes' if [] else 'no' }} {{ n is none }} "
        "{{ [] == [] }} {{ d == {'a': 1, 'b': 2} }} {{ 'no' if missing }}|", xs);
  plain("concatenation",
        "{{ 'a' ~ 1 ~ none ~ true ~ [1, 'b'] ~ {'k': 'v'} ~ 2.50 }} {{ 'x' + 'y' }} {{ s ~ '!' }}", xs);
  plain("literals", "{{ [1, 'two', none, true, false, 2.5, [3]] }} {{ {'a': 'b', 'c': [1]} }} {{ (1, 2) }} "
        "{{ 'it\\'s' }} {{ \"quote \\\"q\\\"\" }} {{ 'tab\\tnew\\nline' }} {{ 'back\\\\slash' }} {{ 'u\\u00e9' }} "
        "{{ 'adjacent' ' strings' }} {{ [\"it's\", 'say \"hi\"', 'both \\' \"'] }}");
  plain("slices and indexing", "{{ xs[0] }} {{ xs[-1] }} {{ xs[1:3] }} {{ xs[:2] }} {{ xs[::2] }} {{ xs[::-1] }} "
        "{{ xs[-2:] }} {{ s[0] }} {{ s[-5:] }} {{ s[::-1] }} {{ s[1:4] }} {{ 'ünï'[1] }} {{ 'ünïcödé'[2:5] }} "
        "{{ xs[10] is defined }} {{ d['a'] }} {{ d.a }} {{ d['zz'] is defined }} {{ people[0].name }} "
        "{{ people[1].age is defined }}", xs);
  plain("string methods", "{{ '  pad  '.strip() }}|{{ '  pad  '.lstrip() }}|{{ '  pad  '.rstrip() }}|"
        "{{ 'xxhixx'.strip('x') }}|{{ s.split(', ') }}|{{ 'a b  c'.split() }}|{{ 'a,b,c'.split(',', 1) }}|"
        "{{ s.startswith('Hell') }}|{{ s.endswith(('x', 'ld')) }}|{{ s.upper() }}|{{ s.lower() }}|"
        "{{ s.replace('l', 'L') }}|{{ s.replace('l', 'L', 2) }}|{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|"
        "{{ s.find('World') }}|{{ s.count('l') }}|{{ '-'.join(['a', 'b']) }}|{{ '\\u00a0 nbsp\\u2003'.strip() }}|", xs);
  plain("dict methods", "{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 9) }} {{ d['items'] is defined }}", xs);

  // filters
  plain("filters", "{{ '  t  ' | trim }}|{{ xs | length }}|{{ s | length }}|{{ d | length }}|{{ xs | join(',') }}|"
        "{{ people | join(', ', attribute='name') }}|{{ missing | default('dflt') }}|{{ '' | default('e', true) }}|"
        "{{ xs | first }}|{{ xs | last }}|{{ 'abc' | list }}|{{ s | upper }}|{{ s | lower }}|{{ 'x y' | title }}|"
        "{{ 'x y' | capitalize }}|{{ s | replace('o', '0') }}|{{ 42 | string }}|{{ '12' | int + 1 }}|"
        "{{ 'x' | int }}|{{ '2.5' | float }}|{{ -3 | abs }}|{{ 2.567 | round(2) }}|{{ 2.5 | round }}|"
        "{{ xs | reverse | list }}|{{ xs | unique | list }}|{{ xs | sum }}|{{ xs | max }}|{{ xs | min }}|"
        "{{ '<a & b>' | e }}|{{ 'x' | safe }}|{{ 'line1\\nline2\\n\\nline4' | indent(2) }}|"
        "{{ 'a\\nb' | indent(3, true) }}|{{ xs | count }}", xs);
  plain("selection filters", "{{ xs | select('odd') | list }} {{ xs | reject('odd') | list }} "
        "{{ xs | select('divisibleby', 2) | list }} {{ people | selectattr('age') | map(attribute='name') | list }} "
        "{{ people | rejectattr('age', 'defined') | map(attribute='name') | list }} "
        "{{ people | selectattr('name', 'equalto', 'Bob') | list | length }} {{ xs | map('string') | join }} "
        "{{ people | map(attribute='age', default=0) | list }} {{ xs | select('gt', 2) | list }}", xs);
  plain("tojson", "{{ d | tojson }}|{{ people | tojson }}|{{ people | tojson(indent=2) }}|{{ {'u': 'ü\\n\"', "
        "'f': 1.0, 'e': 1e-07, 'big': 1e22, 'n': none, 't': true, 'l': [], 'o': {}} | tojson }}|"
        "{{ 'x' | tojson }}|{{ [1, [2, {'a': []}]] | tojson(indent=1) }}", xs);
  // tests
  plain("tests", "{{ x is defined }} {{ xs is defined }} {{ n is none }} {{ n is not none }} {{ s is string }} "
        "{{ xs is sequence }} {{ d is mapping }} {{ s is iterable }} {{ 3 is odd }} {{ 3 is even }} "
        "{{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} "
        "{{ true is boolean }} {{ true is true }} {{ false is false }} {{ 's' is eq 's' }} {{ 2 is gt 1 }} "
        "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 2 is in xs }} {{ range is callable }} {{ s is not string }}", xs);
  plain("range", "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }}");
  // errors on both sides
  plain("undefined arithmetic", "{{ missing + 1 }}");
  plain("undefined attribute", "{{ missing.attr }}");
  plain("raise_exception", "{{ raise_exception('stop here') }}");
  plain("set on non-namespace", "{% set d.x = 1 %}", xs);
  plain("unknown filter", "{{ 1 | no_such_filter }}");
  return out;
}

TEST(JinjaPypi, MatchesJinja2AsTransformersSetsItUp) {
  if (!python_has_jinja2()) GTEST_SKIP() << "python3 cannot import jinja2 (pip install jinja2)";
  const std::vector<Case> all = cases();
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_jinja_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  json in = json::array();
  for (const Case& c : all) in.push_back({{"template", c.template_text}, {"context", c.context}});
  std::ofstream(dir / "cases.json") << in.dump();
  std::ofstream(dir / "render.py") << kScript;
  const std::string command = "python3 " + (dir / "render.py").string() + " " + (dir / "cases.json").string() + " " +
                              (dir / "out.json").string();
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream f(dir / "out.json");
  const json expected = json::parse(f);
  ASSERT_EQ(expected.size(), all.size());
  int errors = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const Case& c = all[i];
    std::string text, error;
    try {
      text = Template(c.template_text, c.name).render(with_functions(c.context)).text;
    } catch (const Error& e) {
      error = e.what();
    }
    const json& want = expected[i];
    if (want["ok"].get<bool>()) {
      EXPECT_TRUE(error.empty()) << c.name << ": we fail where jinja2 renders\n  ours: " << error;
      EXPECT_EQ(text, want["text"].get<std::string>()) << c.name;
    } else {
      ++errors;
      EXPECT_FALSE(error.empty()) << c.name << ": jinja2 fails (" << want["error"].get<std::string>()
                                            << ") where we render:\n" << text;
    }
  }
  EXPECT_GE(errors, 6) << "the error cases should fail on both sides";
  if (std::getenv("SHARDTRAIN_KEEP_JINJA_CASES") == nullptr) fs::remove_all(dir);
}

}  // namespace
}  // namespace shardtrain::data::jinja
