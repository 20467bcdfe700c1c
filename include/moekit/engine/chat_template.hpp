#pragma once
/// \file Chat templates: a conversation (system/user/assistant messages) → the prompt text an
/// instruct model was trained on. As llama.cpp does, moekit has no Jinja engine: it implements
/// the common templates and recognises which one a model ships from the template's text (GGUF
/// `tokenizer.chat_template`, or `chat_template` in a Hugging Face tokenizer_config.json, or its
/// chat_template.jinja). A template it does not recognise is refused, never approximated.
///
/// Each format renders exactly the string Hugging Face's `apply_chat_template(tokenize=False)`
/// gives for the model's own template, errors included (the same messages where the template
/// raises); tests/chat/chat_template_test.cpp checks it against strings made by transformers
/// (scripts/make_chat_template_fixtures.py). Python's `str.strip()` in the templates (Llama-2's
/// `strip`, Llama-3's `trim`) is applied to ASCII whitespace only.

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/error.hpp"

namespace moekit::engine {

/// One message of a conversation (OpenAI's and Hugging Face's {"role", "content"}).
struct ChatMessage {
  std::string role;  ///< "system", "user", "assistant" (others where the format allows them)
  std::string content;
};

/// The template formats moekit implements.
enum class ChatFormat {
  mistral_v1,  ///< Mixtral-8x7B-Instruct-v0.1: "<s> [INST] sys\n\nuser [/INST] answer</s>"
  llama2,      ///< Mistral-7B-Instruct-v0.2, Mixtral's first revision: "<s>[INST] user [/INST]"
  llama2_sys,  ///< Llama-2-chat: "<s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] answer </s>"
  chatml,      ///< Qwen1.5-Chat (with its default system message), OpenHermes: <|im_start|>
  tulu,        ///< OLMo-2-Instruct, Tulu 3: "<|user|>\n...\n<|assistant|>\n", no "\n" after the end
  tulu2,       ///< OLMoE-1B-7B-0924-Instruct (Tulu 2): as tulu, every assistant turn + EOS + "\n"
  llama3,      ///< Llama-3-Instruct: <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
};

inline constexpr std::array<std::pair<std::string_view, ChatFormat>, 7> chat_format_names{{
    {"mistral-v1", ChatFormat::mistral_v1},
    {"llama2", ChatFormat::llama2},
    {"llama2-sys", ChatFormat::llama2_sys},
    {"chatml", ChatFormat::chatml},
    {"tulu", ChatFormat::tulu},
    {"tulu2", ChatFormat::tulu2},
    {"llama3", ChatFormat::llama3},
}};

[[nodiscard]] inline std::string_view chat_format_name(ChatFormat f) noexcept {
  for (const auto& [name, format] : chat_format_names)
    if (format == f) return name;
  return "?";
}

/// "mistral-v1, llama2, ..." for messages naming the choices.
[[nodiscard]] inline std::string chat_format_list() {
  std::string s;
  for (const auto& [name, format] : chat_format_names)
    s += (s.empty() ? "" : ", ") + std::string(name);
  return s;
}

[[nodiscard]] inline std::optional<ChatFormat> chat_format_from_name(std::string_view name) {
  for (const auto& [n, format] : chat_format_names)
    if (n == name) return format;
  return std::nullopt;
}

namespace detail {

/// Python's str.strip() on ASCII whitespace (' ', \t, \n, \v, \f, \r and \x1c-\x1f).
[[nodiscard]] inline std::string_view py_strip(std::string_view s) noexcept {
  auto space = [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u == ' ' || (u >= '\t' && u <= '\r') || (u >= 0x1c && u <= 0x1f);
  };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

[[noreturn]] inline void chat_fail(const std::string& msg) {
  throw Error(ErrorKind::invalid_argument, msg);
}

/// Qwen's ChatML template writes a default system message when the conversation has none; its
/// text is the literal between "<|im_start|>system" + newline and "<|im_end|>" (the newline is a
/// real one, or "\n" escaped in the Jinja string).
[[nodiscard]] inline std::string chatml_default_system(std::string_view tmpl) {
  if (tmpl.find("messages[0]['role'] != 'system'") == std::string_view::npos) return {};
  const std::string_view head = "<|im_start|>system";
  const std::size_t at = tmpl.find(head);
  if (at == std::string_view::npos) return {};
  std::size_t from = at + head.size();
  if (tmpl.substr(from, 1) == "\n")
    from += 1;
  else if (tmpl.substr(from, 2) == "\\n")
    from += 2;
  else
    return {};
  const std::size_t end = tmpl.find("<|im_end|>", from);
  if (end == std::string_view::npos) return {};
  const std::string_view text = tmpl.substr(from, end - from);
  // Only a plain literal: anything Jinja would interpret is not a default message moekit renders.
  if (text.find_first_of("{}'\"\\") != std::string_view::npos) return {};
  return std::string(text);
}

}  // namespace detail

/// A chat template: its format, the texts of the special tokens it writes, and what a turn ends
/// with. `render` is HF's apply_chat_template(tokenize=False) for the model's template.
class ChatTemplate {
 public:
  ChatTemplate(ChatFormat format, std::string bos, std::string eos)
      : format_(format), bos_(std::move(bos)), eos_(std::move(eos)) {}

  [[nodiscard]] ChatFormat format() const noexcept { return format_; }
  [[nodiscard]] std::string_view name() const noexcept { return chat_format_name(format_); }
  [[nodiscard]] const std::string& bos_text() const noexcept { return bos_; }
  [[nodiscard]] const std::string& eos_text() const noexcept { return eos_; }

  /// ChatML: the system message written when the conversation has none ("" = none).
  void set_default_system(std::string text) { default_system_ = std::move(text); }
  [[nodiscard]] const std::string& default_system() const noexcept { return default_system_; }
  /// Tulu: whether the template starts with {{ bos_token }} (OLMoE's and OLMo-2's do, Tulu 3's
  /// not).
  void set_leading_bos(bool on) noexcept { leading_bos_ = on; }
  [[nodiscard]] bool leading_bos() const noexcept { return leading_bos_; }

  /// The text that ends the assistant's turn, where it is not EOS ("" = EOS ends it): generation
  /// stops at it as at EOS.
  [[nodiscard]] std::string end_of_turn() const {
    switch (format_) {
      case ChatFormat::chatml:
        return "<|im_end|>";
      case ChatFormat::llama3:
        return "<|eot_id|>";
      default:
        return {};
    }
  }

  /// Texts in rendered prompts that are single special tokens (BOS, EOS, the format's markers).
  [[nodiscard]] std::vector<std::string> special_texts() const {
    std::vector<std::string> s;
    for (const std::string& t : {bos_, eos_, end_of_turn()})
      if (!t.empty() && std::find(s.begin(), s.end(), t) == s.end()) s.push_back(t);
    if (format_ == ChatFormat::chatml) s.emplace_back("<|im_start|>");
    if (format_ == ChatFormat::llama3) {
      s.emplace_back("<|start_header_id|>");
      s.emplace_back("<|end_header_id|>");
    }
    return s;
  }

  /// The prompt for `messages`; with `add_generation_prompt` the text that opens the assistant's
  /// reply where the format has one. Throws `Error(invalid_argument)` with the template's own
  /// message where it raises (roles that do not alternate, a role it does not take).
  [[nodiscard]] std::string render(std::span<const ChatMessage> messages,
                                   bool add_generation_prompt) const {
    switch (format_) {
      case ChatFormat::mistral_v1:
        return render_mistral_v1(messages);
      case ChatFormat::llama2:
        return render_llama2(messages);
      case ChatFormat::llama2_sys:
        return render_llama2_sys(messages);
      case ChatFormat::chatml:
        return render_chatml(messages, add_generation_prompt);
      case ChatFormat::tulu:
      case ChatFormat::tulu2:
        return render_tulu(messages, add_generation_prompt);
      case ChatFormat::llama3:
        return render_llama3(messages, add_generation_prompt);
    }
    return {};
  }

 private:
  static void check_alternation(std::span<const ChatMessage> loop, std::string_view message) {
    for (std::size_t i = 0; i < loop.size(); ++i)
      if ((loop[i].role == "user") != (i % 2 == 0)) detail::chat_fail(std::string(message));
  }

  std::string render_mistral_v1(std::span<const ChatMessage> m) const {
    const bool sys = !m.empty() && m[0].role == "system";
    const auto loop = sys ? m.subspan(1) : m;
    std::string out = bos_;
    for (std::size_t i = 0; i < loop.size(); ++i) {
      if ((loop[i].role == "user") != (i % 2 == 0))
        detail::chat_fail(
            "After the optional system message, conversation roles must alternate "
            "user/assistant/user/assistant/...");
      if (loop[i].role == "user") {
        out += " [INST] ";
        if (i == 0 && sys) out += m[0].content + "\n\n";
        out += loop[i].content + " [/INST]";
      } else if (loop[i].role == "assistant") {
        out += " " + loop[i].content + eos_;
      } else {
        detail::chat_fail(
            "Only user and assistant roles are supported, with the exception of an initial "
            "optional system message!");
      }
    }
    return out;
  }

  std::string render_llama2(std::span<const ChatMessage> m) const {
    std::string out = bos_;
    for (std::size_t i = 0; i < m.size(); ++i) {
      if ((m[i].role == "user") != (i % 2 == 0))
        detail::chat_fail("Conversation roles must alternate user/assistant/user/assistant/...");
      if (m[i].role == "user")
        out += "[INST] " + m[i].content + " [/INST]";
      else if (m[i].role == "assistant")
        out += m[i].content + eos_;
      else
        detail::chat_fail("Only user and assistant roles are supported!");
    }
    return out;
  }

  std::string render_llama2_sys(std::span<const ChatMessage> m) const {
    const bool sys = !m.empty() && m[0].role == "system";
    const auto loop = sys ? m.subspan(1) : m;
    check_alternation(loop, "Conversation roles must alternate user/assistant/user/assistant/...");
    std::string out;
    for (std::size_t i = 0; i < loop.size(); ++i) {
      const std::string content =
          i == 0 && sys ? "<<SYS>>\n" + m[0].content + "\n<</SYS>>\n\n" + loop[i].content
                        : loop[i].content;
      if (loop[i].role == "user")
        out += bos_ + "[INST] " + std::string(detail::py_strip(content)) + " [/INST]";
      else if (loop[i].role == "assistant")
        out += " " + std::string(detail::py_strip(content)) + " " + eos_;
    }
    return out;
  }

  std::string render_chatml(std::span<const ChatMessage> m, bool gen) const {
    std::string out;
    for (std::size_t i = 0; i < m.size(); ++i) {
      if (i == 0 && m[0].role != "system" && !default_system_.empty())
        out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
      out += "<|im_start|>" + m[i].role + "\n" + m[i].content + "<|im_end|>\n";
    }
    if (gen) out += "<|im_start|>assistant\n";
    return out;
  }

  // Tulu 3 drops the newline after the last assistant turn; Tulu 2 writes it after every turn
  // (the template's line break after {{ ... }}). Other roles write nothing in either.
  std::string render_tulu(std::span<const ChatMessage> m, bool gen) const {
    std::string out = leading_bos_ ? bos_ : std::string();
    for (std::size_t i = 0; i < m.size(); ++i) {
      const bool last = i + 1 == m.size();
      if (m[i].role == "system" || m[i].role == "user")
        out += "<|" + m[i].role + "|>\n" + m[i].content + "\n";
      else if (m[i].role == "assistant")
        out += "<|assistant|>\n" + m[i].content + eos_ +
               (last && format_ == ChatFormat::tulu ? "" : "\n");
      if (last && gen) out += "<|assistant|>\n";
    }
    return out;
  }

  std::string render_llama3(std::span<const ChatMessage> m, bool gen) const {
    std::string out;
    for (std::size_t i = 0; i < m.size(); ++i) {
      if (i == 0) out += bos_;
      out += "<|start_header_id|>" + m[i].role + "<|end_header_id|>\n\n" +
             std::string(detail::py_strip(m[i].content)) + "<|eot_id|>";
    }
    if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return out;
  }

  ChatFormat format_;
  std::string bos_, eos_;
  std::string default_system_;
  bool leading_bos_ = true;
};

/// The format of a template text, or nullopt when it is none moekit implements. Recognised by
/// the markers each format's templates contain (as llama.cpp does); variants whose output differs
/// (Mistral v3/v7 with tools, Llama-3.1's dated system header, Zephyr) are not recognised.
[[nodiscard]] inline std::optional<ChatFormat> detect_chat_format(std::string_view tmpl) {
  auto has = [&](std::string_view s) { return tmpl.find(s) != std::string_view::npos; };
  if (const auto named = chat_format_from_name(detail::py_strip(tmpl))) return named;
  if (has("<|im_start|>"))
    return has("<|im_sep|>") || has("<end_of_utterance>") ? std::nullopt
                                                          : std::optional(ChatFormat::chatml);
  if (has("[INST]")) {
    if (has("[SYSTEM_PROMPT]") || has("[AVAILABLE_TOOLS]")) return std::nullopt;
    if (has("' [INST] ' + system_message")) return ChatFormat::mistral_v1;
    if (has("<<SYS>>") && has("content.strip()") && has("bos_token + '[INST] '"))
      return ChatFormat::llama2_sys;
    if (!has("<<SYS>>") && has("'[INST] ' + message['content'] + ' [/INST]'"))
      return ChatFormat::llama2;
    return std::nullopt;
  }
  if (has("<|user|>") && has("<|assistant|>") && has("if not loop.last") && !has("<|end|>"))
    return ChatFormat::tulu;
  // Tulu 2's: its newlines are the template's own line breaks after each {{ }} (the one in each
  // quoted marker a real newline or "\n"); Zephyr's (EOS after every turn) and Phi-3's (<|end|>)
  // differ.
  auto has_marker = [&](std::string_view role) {
    for (std::string_view nl : {"\n", "\\n"})
      if (has("'<|" + std::string(role) + "|>" + std::string(nl) + "' + message['content'] }}\n"))
        return true;
    return false;
  };
  if (has_marker("system") && has_marker("user") && has("message['content'] + eos_token }}\n") &&
      has("{{ '<|assistant|>' }}\n") && !has("<|end|>"))
    return ChatFormat::tulu2;
  if (has("<|start_header_id|>") && has("<|eot_id|>") && !has("Cutting Knowledge") && !has("tools"))
    return ChatFormat::llama3;
  return std::nullopt;
}

/// The template `tmpl` (a template text or a format's name) with the model's BOS/EOS texts.
/// Throws `Error(unsupported)` naming `source` and the template's start when it is not one
/// moekit implements.
[[nodiscard]] inline ChatTemplate make_chat_template(std::string_view tmpl, std::string bos,
                                                     std::string eos, std::string_view source) {
  const auto format = detect_chat_format(tmpl);
  if (!format) {
    std::string head(tmpl.substr(0, 120));
    std::replace(head.begin(), head.end(), '\n', ' ');
    throw Error(ErrorKind::unsupported,
                std::string(source) + ": chat template not recognised (it starts '" + head +
                    (tmpl.size() > 120 ? "...'" : "'") + "); pass --chat-template with one of " +
                    chat_format_list());
  }
  ChatTemplate t(*format, std::move(bos), std::move(eos));
  if (*format == ChatFormat::chatml) t.set_default_system(detail::chatml_default_system(tmpl));
  if (*format == ChatFormat::tulu || *format == ChatFormat::tulu2)
    t.set_leading_bos(detail::py_strip(tmpl).starts_with("{{ bos_token }}") ||
                      detail::py_strip(tmpl).starts_with("{{- bos_token }}") ||
                      chat_format_from_name(detail::py_strip(tmpl)).has_value());
  return t;
}

/// The chat template text a Hugging Face model directory ships: chat_template.jinja, else
/// tokenizer_config.json's `chat_template` (a string, or a list of {name, template}: the one
/// named "default"). nullopt when there is none.
[[nodiscard]] inline std::optional<std::string> read_hf_chat_template(
    const std::filesystem::path& dir) {
  const auto jinja = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja)) {
    std::ifstream in(jinja, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  const auto cfg = dir / "tokenizer_config.json";
  if (!std::filesystem::exists(cfg)) return std::nullopt;
  std::ifstream in(cfg, std::ios::binary);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::invalid_format, cfg.string() + ": not JSON (" + e.what() + ")");
  }
  if (!j.contains("chat_template") || j["chat_template"].is_null()) return std::nullopt;
  const auto& t = j["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array())
    for (const auto& e : t)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
          e["template"].is_string())
        return e["template"].get<std::string>();
  throw Error(ErrorKind::invalid_format,
              cfg.string() +
                  ": field chat_template is neither a string nor a list holding one "
                  "named \"default\"");
}

}  // namespace moekit::engine
