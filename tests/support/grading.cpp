// grading.cpp — the graded-check runner and the rank-collective helpers declared in grading.h.
// The record format it writes (GoogleTest properties in the --gtest_output JSON): docs/grading.md.
#include "grading.h"

#include <algorithm>  // defines: std::stable_partition
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "scalelab/core/error.h"

namespace scalelab::grading {

namespace {

RankReducer g_reducer;  // default: a world of one rank
std::string g_track;

constexpr size_t kMaxMessageChars = 2000;  // per rank in check_message; the full text is in "failures"

// "TrainStepMatchesReference" -> "train_step_matches_reference". sl_add_graded_test derives the
// ctest name with the same rule (cmake/scalelab.cmake), so the two must stay in step.
std::string snake_case(const std::string& camel) {
  std::string out;
  for (size_t i = 0; i < camel.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(camel[i]);
    const unsigned char prev = i > 0 ? static_cast<unsigned char>(camel[i - 1]) : 0;
    if (std::isupper(c) && i > 0 && (std::islower(prev) || std::isdigit(prev))) out += '_';
    out += static_cast<char>(std::tolower(c));
  }
  return out;
}

// An id is "labNN.<snake_case of the TEST name>"; returns an empty string when it is, else what is wrong.
std::string id_problem(const std::string& id, const ::testing::TestInfo& info) {
  const size_t dot = id.find('.');
  const std::string lab = id.substr(0, dot);
  const bool lab_ok = lab.size() == 5 && lab.compare(0, 3, "lab") == 0 && std::isdigit(lab[3]) && std::isdigit(lab[4]);
  const std::string expected = lab + "." + snake_case(info.name());
  if (lab_ok && id == expected) return "";
  return "check id '" + id + "' does not match TEST(" + info.test_suite_name() + ", " + info.name() + "): expected '" +
         (lab_ok ? expected : "labNN." + snake_case(info.name())) +
         "' (sl_add_graded_test names the ctest after the TEST name; rename one of them)";
}

// Worst first: a TODO left open outranks a failure, which outranks a skip.
int severity(const std::string& status) {
  if (status == kNotImplemented) return 3;
  if (status == kFailed) return 2;
  if (status == kSkipped) return 1;
  return 0;  // passed
}

// The messages of this test's failures (or of its skip), as GoogleTest recorded them.
std::string collect_messages(bool want_skip) {
  const ::testing::TestResult* result = ::testing::UnitTest::GetInstance()->current_test_info()->result();
  std::string text;
  for (int i = 0; i < result->total_part_count(); ++i) {
    const ::testing::TestPartResult& part = result->GetTestPartResult(i);
    if (want_skip ? !part.skipped() : !part.failed()) continue;
    std::string m = part.message();
    if (m.rfind("Failed\n", 0) == 0) m.erase(0, 7);  // ADD_FAILURE's prefix says nothing the status does not
    if (!text.empty()) text += "\n";
    text += m;
    if (text.size() > kMaxMessageChars) {
      text.resize(kMaxMessageChars);
      text += " [...]";
      break;
    }
  }
  return text;
}

// "rank 3: max err" said by rank 3 -> "max err": the report names the ranks itself.
std::string without_own_rank(const std::string& message, size_t rank) {
  const std::string prefix = "rank " + std::to_string(rank) + ": ";
  return message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
}

// A communicator's wait timeout ("rank 0 waited 20.0 s for all_reduce ..."): the symptom on the ranks left
// waiting when another rank stopped, rarely the cause.
bool is_wait_timeout(const std::string& message) {
  const size_t at = message.find(" waited ");
  return at != std::string::npos && message.find(" s for ", at) != std::string::npos;
}

// Groups whose message is a root cause first, wait timeouts after them; otherwise in rank order.
std::vector<RankGroup> causes_first(std::vector<RankGroup> groups) {
  std::stable_partition(groups.begin(), groups.end(), [](const RankGroup& g) { return !is_wait_timeout(g.message); });
  return groups;
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
std::vector<RankGroup> group_by_message(const std::vector<std::string>& messages) {
  std::vector<RankGroup> groups;
  std::vector<std::vector<size_t>> senders;  // senders[i]: the ranks of groups[i]
  for (size_t r = 0; r < messages.size(); ++r) {
    if (messages[r].empty()) continue;
    size_t i = 0;
    while (i < groups.size() && groups[i].message != messages[r]) ++i;
    if (i == groups.size()) {
      groups.push_back({"", messages[r]});
      senders.emplace_back();
    }
    senders[i].push_back(r);
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::vector<size_t>& ranks = senders[i];
    if (ranks.size() == messages.size() && ranks.size() > 1) {
      groups[i].ranks = "all " + std::to_string(ranks.size()) + " ranks";
      continue;
    }
    std::string list;  // "2" or "0, 2-3": a run of three or more consecutive ranks is written as a range
    for (size_t j = 0; j < ranks.size();) {
      size_t k = j;
      while (k + 1 < ranks.size() && ranks[k + 1] == ranks[k] + 1) ++k;
      list += (list.empty() ? "" : ", ") + std::to_string(ranks[j]) +
              (k == j ? "" : (k == j + 1 ? ", " : "-") + std::to_string(ranks[k]));
      j = k + 1;
    }
    groups[i].ranks = (ranks.size() == 1 ? "rank " : "ranks ") + list;
  }
  return groups;
}

void Record::measured(const std::string& text) { measured_ = text; }

void Record::measured(const char* fmt, ...) {
  char buf[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  measured_ = buf;
}

// ---------------------------------------------------------------------------------------------
void run(const Check& check, const std::function<void(Record&)>& body) {
  using ::testing::Test;
  const ::testing::TestInfo& info = *::testing::UnitTest::GetInstance()->current_test_info();

  // 1. The declaration: recorded first, so it is in the record whatever the body does.
  Test::RecordProperty("check_id", check.id);
  Test::RecordProperty("check_points", check.points);
  Test::RecordProperty("check_target", check.target);
  Test::RecordProperty("check_hint", check.hint);
  if (!g_track.empty()) Test::RecordProperty("check_track", g_track);

  const std::string bad_id = id_problem(check.id, info);
  if (!bad_id.empty()) {
    Test::RecordProperty("check_status", kFailed);
    Test::RecordProperty("check_message", bad_id);
    ADD_FAILURE() << bad_id;
    return;
  }
  if (!env_or_empty("SL_GRADING_DESCRIBE").empty()) {  // the grader asks what a crashed check was
    Test::RecordProperty("check_status", "described");
    return;
  }
  const std::string skip_reason = env_or_empty("SL_GRADING_SKIP");
  if (!skip_reason.empty()) {
    Test::RecordProperty("check_status", kSkipped);
    Test::RecordProperty("check_message", skip_reason);
    GTEST_SKIP() << skip_reason;
  }

  // 2. The body. An exception must not end the program: it ends the check, with a status.
  Record record;
  std::string status;
  std::string todo;  // the TODO id when the learner's code is not written yet, e.g. "lab01-2"
  try {
    body(record);
  } catch (const NotImplemented& e) {
    status = kNotImplemented;
    todo = e.todo;
    ADD_FAILURE() << e.what();  // "[scalelab] not implemented: lab01-2 flops_per_token" + a hint
  } catch (const Error& e) {
    ADD_FAILURE() << "scalelab::Error thrown:\n" << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "exception thrown: " << e.what();
  } catch (...) {
    ADD_FAILURE() << "unknown exception thrown";
  }
  if (status.empty()) {
    if (Test::HasFailure()) {
      status = kFailed;
    } else if (Test::IsSkipped()) {
      status = kSkipped;
    } else {
      status = kPassed;
    }
  }
  // "lab01-2 flops_per_token" -> "TODO(lab01-2) flops_per_token": the fence to look for in the lab's file.
  const size_t space = todo.find(' ');
  std::string message = status == kNotImplemented ? "TODO(" + todo.substr(0, space) + ")" +
                                                        (space == std::string::npos ? "" : todo.substr(space))
                                                  : collect_messages(/*want_skip=*/status == kSkipped);

  // 3. Combine the ranks (identity for one rank): the worst status wins, every rank's message is kept.
  const RankReducer& rr = g_reducer;
  if (rr.size > 1 && rr.all_gather) {
    const std::vector<std::string> statuses = rr.all_gather(status);
    const std::vector<std::string> messages = rr.all_gather(message);
    const std::vector<std::string> measured = rr.all_gather(record.measured_text());
    std::string combined_status = kPassed;
    std::vector<std::string> reports(statuses.size());  // "failed): <message>" per rank that did not pass
    for (size_t r = 0; r < statuses.size(); ++r) {
      if (severity(statuses[r]) > severity(combined_status)) combined_status = statuses[r];
      if (statuses[r] != kPassed) reports[r] = statuses[r] + "): " + messages[r];
    }
    // Ranks that agree are reported once, as one rank would be; ranks that differ one group at a time
    // ("rank 1 (failed): ...", "ranks 0, 2 (not_implemented): ..."), a rank that threw before the ranks
    // whose waits then timed out: the cause first.
    const std::vector<RankGroup> groups = causes_first(group_by_message(reports));
    std::string combined_message;
    if (groups.size() == 1 && groups[0].ranks.rfind("all ", 0) == 0) {
      combined_message = messages[0];
    } else {
      for (const RankGroup& g : groups)
        combined_message += (combined_message.empty() ? "" : "\n") + g.ranks + " (" + g.message;
    }
    if (severity(combined_status) >= severity(kFailed) && severity(status) < severity(kFailed)) {
      ADD_FAILURE() << "another rank failed:\n" << combined_message;  // so this rank's result fails too
    }
    status = combined_status;
    message = combined_message;
    // What the ranks measured: one line when they agree; else one line per distinct value with its ranks
    // and their status, the ranks that did not pass first, so a failure never reads as rank 0's pass.
    if (std::any_of(measured.begin(), measured.end(), [&](const std::string& m) { return m != measured[0]; })) {
      std::vector<std::string> failing(measured.size()), passing(measured.size());
      for (size_t r = 0; r < measured.size(); ++r)
        (statuses[r] == kPassed ? passing : failing)[r] =
            statuses[r] + "): " + (measured[r].empty() ? "(nothing measured)" : measured[r]);
      std::string text;
      for (const std::vector<std::string>* side : {&failing, &passing})
        for (const RankGroup& g : causes_first(group_by_message(*side)))
          text += (text.empty() ? "" : "\n") + g.ranks + " (" + g.message;
      record.measured(text);
    }
  }

  // 4. The outcome.
  Test::RecordProperty("check_status", status);
  Test::RecordProperty("check_measured", record.measured_text());
  if (!message.empty()) Test::RecordProperty("check_message", message);
  if (!todo.empty()) Test::RecordProperty("check_todo", todo);
  if (status == kSkipped && !record.optional_text().empty())
    Test::RecordProperty("check_optional", record.optional_text());
}

// ---------------------------------------------------------------------------------------------
void set_rank_reducer(RankReducer reducer) { g_reducer = std::move(reducer); }
const RankReducer& rank_reducer() { return g_reducer; }

::testing::AssertionResult all_ranks(bool local_ok, const std::string& local_message) {
  const RankReducer& rr = g_reducer;
  const bool all_ok = (rr.size > 1 && rr.all_and) ? rr.all_and(local_ok) : local_ok;
  // Gather unconditionally: a collective must be entered by every rank, passing or not.
  std::vector<std::string> messages;
  const std::string mine = local_ok ? std::string() : (local_message.empty() ? "failed" : local_message);
  if (rr.size > 1 && rr.all_gather) {
    messages = rr.all_gather(mine);
  } else {
    messages = {mine};
  }
  if (all_ok) return ::testing::AssertionSuccess();
  for (size_t r = 0; r < messages.size(); ++r) messages[r] = without_own_rank(messages[r], r);
  std::string report;  // "rank 1: max err 3e-2; ranks 0, 2-3: max err 1e-1", or "all 4 ranks: ..."
  for (const RankGroup& g : group_by_message(messages))
    report += (report.empty() ? "" : "; ") + g.ranks + ": " + g.message;
  return ::testing::AssertionFailure() << report;
}

// ---------------------------------------------------------------------------------------------
void set_track(const std::string& track) { g_track = track; }
const std::string& track() { return g_track; }

std::string error_excerpt(const std::string& log, size_t max_lines) {
  static const char* const kWords[] = {"error",  "fail",   "abort",           "exception", "terminate", "timed out",
                                       "killed", "signal", "not implemented", "hint:",     "what()"};
  std::vector<std::string> lines, errors;
  size_t start = 0;
  while (start < log.size()) {
    size_t end = log.find('\n', start);
    if (end == std::string::npos) end = log.size();
    if (end > start) lines.push_back(log.substr(start, end - start));
    start = end + 1;
  }
  for (const std::string& line : lines) {
    std::string lower = line;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (const char* w : kWords)
      if (lower.find(w) != std::string::npos) {
        errors.push_back(line);
        break;
      }
  }
  std::string out;
  const size_t n_errors = std::min(errors.size(), max_lines);
  for (size_t i = 0; i < n_errors; ++i) out += errors[i] + "\n";
  if (errors.size() > n_errors) out += "... (" + std::to_string(errors.size() - n_errors) + " more error lines)\n";
  const size_t n_last = std::min(lines.size(), errors.empty() ? max_lines : size_t{4});
  out += "-- its last " + std::to_string(n_last) + " of " + std::to_string(lines.size()) + " lines:\n";
  for (size_t i = lines.size() - n_last; i < lines.size(); ++i) out += lines[i] + "\n";
  return out;
}

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    const char* v = std::getenv(name);
    if (v && *v) return std::atoi(v);
  }
  return 0;
}

}  // namespace scalelab::grading
