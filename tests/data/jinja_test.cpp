// The Jinja interpreter without Python: where a tagged string's bytes land in the output
// (through trim, concatenation, slices, joins and block sets), the loop iterations and
// generation blocks it records, and the errors it gives (the template's name and line).
// jinja_pypi_test.cpp checks the rendered text against jinja2 itself.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/jinja.h"
#include "testing/compare.h"

namespace shardtrain::data::jinja {
namespace {

using testing::throws_with;

// A context of one message list whose contents carry their index as a tag.
Value messages_context(const std::vector<std::string>& contents) {
  Value::List list;
  for (size_t i = 0; i < contents.size(); ++i) {
    Value::Dict m;
    m.set("role", Value::string(i % 2 == 0 ? "user" : "assistant"));
    m.set("content", Value::string(contents[i], static_cast<int>(i)));
    list.push_back(Value::dict(std::move(m)));
  }
  Value::Dict c;
  c.set("messages", Value::list(std::move(list)));
  return Value::dict(std::move(c));
}

// The output's bytes tagged `tag`, in order.
std::string tagged(const Rendered& r, int tag) {
  std::string out;
  for (const Segment& s : r.segments)
    if (s.tag == tag) out += r.text.substr(s.begin, s.end - s.begin);
  return out;
}

TEST(Jinja, TaggedBytesKeepTheirTagThroughStringOperations) {
  const Value ctx = messages_context({"  hello world \n", "abcdef"});
  const Template t(
      "{% for m in messages %}<{{ m.role }}>{{ (m.content | trim).upper() if false else m.content | trim }}"
      "|{{ m.content[1:4] }}|{{ '-' ~ m.content ~ '-' }}|{{ m.content.split(' ') | join('+') }}"
      "{% set block %}[{{ m.content.strip() }}]{% endset %}{{ block }}</{{ m.role }}>{% endfor %}",
      "tags");
  const Rendered r = t.render(ctx);
  EXPECT_EQ(r.text,
            "<user>hello world| he|-  hello world \n-|++hello+world+\n[hello world]</user>"
            "<assistant>abcdef|bcd|-abcdef-|abcdef[abcdef]</assistant>");
  // every byte that came from message 0's content, and only those, carries tag 0
  EXPECT_EQ(tagged(r, 0), "hello world he  hello world \nhelloworld\nhello world");
  EXPECT_EQ(tagged(r, 1), "abcdefbcdabcdefabcdefabcdef");
  // an upper-cased copy is new text: no tag
  const Rendered upper = Template("{{ messages[1].content.upper() }}", "upper").render(ctx);
  EXPECT_EQ(upper.text, "ABCDEF");
  EXPECT_TRUE(upper.segments.empty());
}

TEST(Jinja, RecordsLoopIterationsOverDictsAndGenerationBlocks) {
  const Value ctx = messages_context({"q", "a", "q2"});
  const Template t(
      "S{% for m in messages[1:] %}({% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
      "{% endgeneration %}{% else %}{{ m.content }}{% endif %}){% endfor %}E",
      "loops");
  const Rendered r = t.render(ctx);
  EXPECT_EQ(r.text, "S(a)(q2)E");
  ASSERT_EQ(r.iterations.size(), 2u);
  // the slice's items are the list's own dicts
  EXPECT_EQ(r.iterations[0].item, &ctx.entries().find("messages")->items()[1].entries());
  EXPECT_EQ(r.iterations[0].begin, 1u);
  EXPECT_EQ(r.iterations[0].end, 4u);
  EXPECT_EQ(r.iterations[1].item, &ctx.entries().find("messages")->items()[2].entries());
  ASSERT_EQ(r.generation.size(), 1u);
  EXPECT_EQ(r.generation[0], (std::pair<size_t, size_t>{2, 3}));
}

// Text rendered inside a macro or a block `set` becomes a value and leaves the output: the loop
// iterations and generation blocks recorded there leave with it (a fuzzed template once left
// spans pointing past the end of the output). The outer loop's iterations still count.
TEST(Jinja, IterationsAndGenerationInsideCapturedTextLeaveWithIt) {
  const Value ctx = messages_context({"q", "a"});
  const Template t(
      "{% macro all() %}{% for m in messages %}{% generation %}{{ m.content * 8 }}{% endgeneration %}"
      "{% endfor %}{% endmacro %}{% set block %}{% for m in messages %}{{ m.role }}{% endfor %}{% endset %}"
      "{% for m in messages %}<{{ all()[:2] }}{{ block[:1] }}>{% endfor %}",
      "captured");
  const Rendered r = t.render(ctx);
  EXPECT_EQ(r.text, "<qqu><qqu>");
  ASSERT_EQ(r.iterations.size(), 2u);
  EXPECT_EQ(r.iterations[0].begin, 0u);
  EXPECT_EQ(r.iterations[0].end, 5u);
  EXPECT_EQ(r.iterations[1].begin, 5u);
  EXPECT_EQ(r.iterations[1].end, 10u);
  EXPECT_TRUE(r.generation.empty());
  EXPECT_EQ(tagged(r, 0), "qqqq");
}

TEST(Jinja, ErrorsNameTheTemplateAndLine) {
  const Value ctx = messages_context({"x"});
  EXPECT_TRUE(throws_with([] { Template("a\n{% include 'b.jinja' %}", "t1"); },
                          "`t1` line 2: `{% include %}` is not supported"));
  EXPECT_TRUE(throws_with([] { Template("{% if true %}open", "t2"); }, "the template ends inside a block; expected "
                                                                        "`{% endif %}`"));
  EXPECT_TRUE(throws_with([] { Template("\n\n{{ 1 + }}", "t3"); }, "`t3` line 3: expected a value"));
  EXPECT_TRUE(throws_with([] { Template("{{ 'never closed }}", "t4"); }, "is never closed"));
  EXPECT_TRUE(throws_with([] { Template("{% for x in y recursive %}{% endfor %}", "t5"); },
                          "recursive for loops are not supported"));
  EXPECT_TRUE(throws_with([&] { (void)Template("\n{{ nothing.attr }}", "t6").render(ctx); },
                          "`t6` line 2: `nothing` is undefined, so it has no attribute `attr`"));
  EXPECT_TRUE(throws_with([&] { (void)Template("{{ messages | no_such }}", "t7").render(ctx); },
                          "unknown filter `no_such`"));
  EXPECT_TRUE(throws_with([&] { (void)Template("{{ messages[0].role + 1 }}", "t8").render(ctx); },
                          "unsupported operand types for +: string and integer"));
  EXPECT_TRUE(throws_with([&] { (void)Template("{% set messages.x = 1 %}", "t9").render(ctx); },
                          "cannot set attribute `x` of `messages`, which is a list, not a namespace()"));
  EXPECT_TRUE(throws_with([&] { (void)Template("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "t11")
                                                .render(ctx); },
                          "macro `f` called 64 deep: runaway recursion?"));
  // what jinja2 leaves quiet stays quiet: undefined prints nothing, has no length, is false
  EXPECT_EQ(Template("[{{ nothing }}{{ nothing | length }}{{ 'y' if nothing else 'n' }}]", "t10").render(ctx).text,
            "[0n]");
}

// A chat template is outside input: what it may make the parser and the renderer do is bounded,
// with an error instead of a crash, a wrapped integer or an exhausted memory.
TEST(Jinja, BoundsWhatATemplateMayMakeItDo) {
  const Value ctx = messages_context({"x"});
  EXPECT_TRUE(throws_with([] { Template("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}", "d1"); },
                          "expressions nested deeper than 200"));
  std::string blocks;
  for (int i = 0; i < 150; ++i) blocks += "{% if true %}";
  for (int i = 0; i < 150; ++i) blocks += "{% endif %}";
  EXPECT_TRUE(throws_with([&] { Template(blocks, "d2"); }, "blocks nested deeper than 100"));
  EXPECT_TRUE(throws_with([&] { (void)Template("{{ 9223372036854775807 + 1 }}", "o1").render(ctx); },
                          "integer + overflows 64 bits"));
  EXPECT_TRUE(throws_with([&] { (void)Template("{{ 3 ** 64 }}", "o2").render(ctx); }, "overflows 64 bits"));
  EXPECT_TRUE(throws_with([&] { (void)Template("{{ (-9223372036854775807 - 1) // -1 }}", "o3").render(ctx); },
                          "overflows 64 bits"));
  EXPECT_EQ(Template("{{ 9223372036854775806 + 1 }}", "o4").render(ctx).text, "9223372036854775807");
  EXPECT_TRUE(throws_with([&] { (void)Template("{{ 'ab' * 100000000 }}", "r1").render(ctx); },
                          "`*` would make more than"));
  EXPECT_TRUE(throws_with([&] { (void)Template("{% for i in range(5000) %}{{ 'y' * 16000 }}{% endfor %}", "r2")
                                                .render(ctx); },
                          "the output would pass 16777216 bytes"));
  EXPECT_TRUE(throws_with([&] { (void)Template("{% for i in range(3) %}{{ 'y' * 10 }}{% endfor %}", "r3")
                                                .render(ctx, 25); },
                          "`r3` line 1: the output would pass 25 bytes"));
  EXPECT_EQ(Template("{% for i in range(3) %}{{ 'y' * 10 }}{% endfor %}", "r4").render(ctx, 30).text.size(), 30u);
  // tojson's indent repeats at every level of every item: a fuzzer's indent of 834,502,048
  // asked for 3.3 GB at once; the indent is bounded, and so is the JSON it makes
  EXPECT_TRUE(throws_with([&] { (void)Template("{{ [1] | tojson(indent=834502048) }}", "j1").render(ctx); },
                          "`j1` line 1: tojson() indent must be at most 1000, found 834502048"));
  EXPECT_TRUE(throws_with([&] { (void)Template("{{ range(100000) | list | tojson(indent=1000) }}", "j2").render(ctx); },
                          "`j2` line 1: tojson: the JSON would pass 16777216 bytes"));
  EXPECT_EQ(Template("{{ [1, [2]] | tojson(indent=-3) }}", "j3").render(ctx).text, "[\n1,\n[\n2\n]\n]");
  // so is any one string a filter or `~` makes (16 MiB, what the output may hold)
  for (const auto& [source, name] : std::vector<std::pair<const char*, const char*>>{
           {"{{ ([1] * 1000) | join('x' * 100000) }}", "s1"},
           {"{{ ('\\n' * 100000) | indent('x' * 1000, blank=true) }}", "s2"},
           {"{{ ('a' * 100000) | replace('a', 'b' * 1000) }}", "s3"},
           {"{{ ('a' * 100000) | replace('', 'b' * 1000) }}", "s4"},
           {"{% set s = 'x' * 10000000 %}{{ s ~ s }}", "s5"}})
    EXPECT_TRUE(throws_with([&] { (void)Template(source, name).render(ctx); },
                            std::string("`") + name + "` line 1: a string would pass 16777216 bytes"))
        << source;
  EXPECT_EQ(Template("{{ ('a' * 1000) | replace('a', 'bc') | length }}", "s6").render(ctx).text, "2000");
  EXPECT_TRUE(throws_with([&] { (void)Template("{% for i in range(1001) %}{% for j in range(1000) %}{% endfor %}"
                                               "{% endfor %}", "l1").render(ctx); },
                          "loops ran more than 1000000 iterations"));
  EXPECT_TRUE(throws_with([&] { (void)Template("{% set big = 'y' * 16000000 %}{% for i in range(100) %}"
                                               "{% set copy = big %}{% endfor %}", "b1").render(ctx); },
                          "expressions built more than 1073741824 bytes"));
  EXPECT_TRUE(throws_with([] { Template("{{ '\\ud800' }}", "e1"); }, "is no Unicode scalar value"));
  EXPECT_TRUE(throws_with([] { Template("{{ '\\x4g' }}", "e2"); }, "non-hexadecimal digit `g`"));
  EXPECT_EQ(Template("{{ '\\u00e9\\x41' }}", "e3").render(ctx).text, "\xc3\xa9" "A");
}

TEST(Jinja, JsonAndPythonPrinting) {
  const Value v = Value::from_json(nlohmann::json::parse(R"({"a": [1, 2.5, "x\n", null, true], "b": {}})"));
  EXPECT_EQ(to_json(v, -1), "{\"a\": [1, 2.5, \"x\\n\", null, true], \"b\": {}}");
  EXPECT_EQ(to_json(v, 2), "{\n  \"a\": [\n    1,\n    2.5,\n    \"x\\n\",\n    null,\n    true\n  ],\n  \"b\": {}\n}");
  EXPECT_TRUE(throws_with([&] { (void)to_json(v, 2, 40); }, "tojson: the JSON would pass 40 bytes"));
  EXPECT_EQ(to_json(v, -1, 43).size(), 43u);  // exactly the limit
  EXPECT_TRUE(throws_with([&] { (void)to_json(v, -1, 42); }, "tojson: the JSON would pass 42 bytes"));
  EXPECT_EQ(to_python_string(v), "{'a': [1, 2.5, 'x\\n', None, True], 'b': {}}");
  for (const auto& [x, want] : std::vector<std::pair<double, const char*>>{
           {1.0, "1.0"}, {0.1, "0.1"}, {1e16, "1e+16"}, {1e15, "1000000000000000.0"}, {1e-5, "1e-05"},
           {0.0001, "0.0001"}, {-2.5e-7, "-2.5e-07"}, {123.456, "123.456"}})
    EXPECT_EQ(to_python_string(Value::number(x)), want) << x;
}

}  // namespace
}  // namespace shardtrain::data::jinja
