// Chat templates against the strings Hugging Face's apply_chat_template renders
// (tests/data/chat_templates/fixtures.json, made by scripts/make_chat_template_fixtures.py).

#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "moekit/engine/chat_template.hpp"

using namespace moekit::engine;

namespace {

const nlohmann::json& fixtures() {
  static const nlohmann::json j = [] {
    std::ifstream in(MOEKIT_TEST_DATA_DIR "/chat_templates/fixtures.json");
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
  }();
  return j;
}

std::vector<ChatMessage> messages_of(const nlohmann::json& conv) {
  std::vector<ChatMessage> m;
  for (const auto& e : conv) m.push_back({e["role"], e["content"]});
  return m;
}

std::string text_or_empty(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : "";
}

ChatTemplate template_named(const std::string& name) {
  const auto& t = fixtures()["templates"][name];
  return make_chat_template(t["template"].get<std::string>(), text_or_empty(t["bos_token"]),
                            text_or_empty(t["eos_token"]), name);
}

}  // namespace

TEST_CASE("every fixture template is detected as its format", "[chat]") {
  for (const auto& [name, t] : fixtures()["templates"].items()) {
    INFO(name);
    const auto format = detect_chat_format(t["template"].get<std::string>());
    REQUIRE(format.has_value());
    CHECK(chat_format_name(*format) == t["format"].get<std::string>());
  }
}

TEST_CASE("rendered prompts equal transformers' apply_chat_template byte for byte", "[chat]") {
  const auto& f = fixtures();
  REQUIRE(f["cases"].size() >= 100);
  std::size_t rendered = 0, refused = 0;
  for (const auto& c : f["cases"]) {
    const std::string name = c["template"], conv = c["conversation"];
    const bool gen = c["add_generation_prompt"];
    INFO(name << " / " << conv << " / add_generation_prompt=" << gen);
    const ChatTemplate t = template_named(name);
    const auto msgs = messages_of(f["conversations"][conv]);
    if (c.contains("expected")) {
      CHECK(t.render(msgs, gen) == c["expected"].get<std::string>());
      ++rendered;
    } else {
      try {
        (void)t.render(msgs, gen);
        FAIL("rendered where transformers raised: " << c["error"].get<std::string>());
      } catch (const moekit::Error& e) {
        CHECK(e.message() == c["error"].get<std::string>());
      }
      ++refused;
    }
  }
  CHECK(rendered > 0);
  CHECK(refused > 0);
}

TEST_CASE("Qwen's default system message is read from its template", "[chat]") {
  CHECK(template_named("qwen1.5-chat").default_system() == "You are a helpful assistant");
  CHECK(template_named("qwen2-instruct").default_system() == "You are a helpful assistant.");
  CHECK(template_named("chatml").default_system().empty());
}

TEST_CASE("OLMoE-0924-Instruct's Tulu 2 template is told from Tulu 3's", "[chat]") {
  const ChatTemplate olmoe = template_named("olmoe-instruct");
  CHECK(olmoe.format() == ChatFormat::tulu2);
  CHECK(olmoe.leading_bos());
  CHECK(template_named("olmo2-instruct").format() == ChatFormat::tulu);
  CHECK(template_named("olmo2-instruct").leading_bos());
  CHECK_FALSE(template_named("tulu3").leading_bos());
  // The same template with the quoted markers' newlines escaped ("\n" in the Jinja string).
  std::string escaped = fixtures()["templates"]["olmoe-instruct"]["template"];
  for (const std::string role : {"system", "user", "assistant"}) {
    const std::string real = "'<|" + role + "|>\n'";
    escaped.replace(escaped.find(real), real.size(), "'<|" + role + "|>\\n'");
  }
  CHECK(detect_chat_format(escaped) == ChatFormat::tulu2);
  // A reply ends with EOS and the line break in Tulu 2 only.
  const std::vector<ChatMessage> m{{"user", "2+2?"}, {"assistant", "4"}};
  CHECK(olmoe.render(m, false) == "<|endoftext|><|user|>\n2+2?\n<|assistant|>\n4<|endoftext|>\n");
  CHECK(template_named("olmo2-instruct").render(m, false) ==
        "<|endoftext|><|user|>\n2+2?\n<|assistant|>\n4<|endoftext|>");
}

TEST_CASE("an unknown template is refused naming where it came from", "[chat]") {
  const std::string zephyr =
      "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
      "message['content'] + eos_token }}\n{% endif %}\n{% endfor %}";
  try {
    (void)make_chat_template(zephyr, "<s>", "</s>", "model.gguf tokenizer.chat_template");
    FAIL("accepted");
  } catch (const moekit::Error& e) {
    CHECK_THAT(e.message(), Catch::Contains("model.gguf tokenizer.chat_template") &&
                                Catch::Contains("not recognised") && Catch::Contains("mistral-v1"));
  }
  CHECK_FALSE(detect_chat_format("[SYSTEM_PROMPT] [INST]").has_value());
  CHECK_FALSE(
      detect_chat_format("<|start_header_id|><|eot_id|> Cutting Knowledge Date").has_value());
}

TEST_CASE("a format is chosen by name", "[chat]") {
  const ChatTemplate t = make_chat_template("chatml", "", "<|im_end|>", "--chat-template");
  CHECK(t.format() == ChatFormat::chatml);
  CHECK(t.end_of_turn() == "<|im_end|>");
  const std::vector<ChatMessage> m{{"user", "hi"}};
  CHECK(t.render(m, true) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  CHECK_FALSE(chat_format_from_name("jinja").has_value());
}
