// libFuzzer harness for the client's answer decoder, DecodeAnswer (request_dispatcher.h).
// Byte 0 picks the task type (every task of the admin and demo modules); the rest is the
// answer envelope. An answer read as a success encodes canonically (save_out through
// EncodeAnswerKeep, decoded into a fresh task, encoded again: the same bytes); a failure has
// a message. A Monitor answer's report must also encode canonically when it decodes.
#include <cstdint>      // uint8_t
#include <cstring>      // strlen
#include <type_traits>  // is_same_v for the Monitor report
#include <vector>       // encoded answers

#include "chi/mods/admin/admin_tasks.h"         // the admin module's tasks
#include "chi/mods/demo/demo_tasks.h"           // the demo module's tasks
#include "chi/task/task_ops.h"                  // NewTask, DeleteTask
#include "chi/transport/request_dispatcher.h"   // DecodeAnswer, EncodeAnswerKeep
#include "fuzz_check.h"                         // FuzzCheck, FuzzBytes

namespace admin = chimaera::admin;
namespace demo = chimaera::demo;
using chi::fuzz::FuzzBytes;
using chi::fuzz::FuzzCheck;

namespace {

/** Encodes a task's answer (rc, message, outputs) as the runtime sends it. */
std::vector<char> EncodeAnswer(chi::Task *t) {
  std::vector<char> out;
  chi::EncodeAnswerKeep(t, &out);
  return out;
}

/** A Monitor report that decodes from the task's bytes encodes back canonically. */
void CheckReport(const admin::MonitorTask &t) {
  admin::MonitorReport report;
  chi::InputArchive in(t.report_.data(), t.report_.size());
  in(report);
  const admin::MonitorReport decoded = t.Decode();
  if (!in.ok()) return;  // Decode() then gives an empty report, as documented
  std::vector<char> once;
  chi::OutputArchive w(once);
  w(report);
  FuzzCheck(w.ok(), "a decoded Monitor report encodes");
  std::vector<char> via_decode;
  chi::OutputArchive w2(via_decode);
  w2(decoded);
  FuzzCheck(via_decode == once, "MonitorTask::Decode gives the report the bytes hold");
  admin::MonitorReport again;
  chi::InputArchive in2(once.data(), once.size());
  in2(again);
  FuzzCheck(in2.ok() && in2.Remaining() == 0, "a re-encoded Monitor report decodes");
  std::vector<char> twice;
  chi::OutputArchive w3(twice);
  w3(again);
  FuzzCheck(twice == once, "a Monitor report's second encoding is the first");
}

/** Decodes the answer into a fresh T and checks what the client would see. */
template <typename T>
void CheckAnswerAs(const char *data, size_t size) {
  T *t = chi::NewTask<T>();
  FuzzCheck(t != nullptr, "a task can be made");
  chi::DecodeAnswer(t, data, size);
  if (t->GetReturnCode() != 0) {
    FuzzCheck(std::strlen(t->GetMessage()) != 0, "an answer read as a failure has a message");
  } else {
    const std::vector<char> once = EncodeAnswer(t);
    T *u = chi::NewTask<T>();
    FuzzCheck(u != nullptr, "a task can be made");
    chi::DecodeAnswer(u, once.data(), once.size());
    FuzzCheck(u->GetReturnCode() == 0, "a re-encoded successful answer reads as a success");
    FuzzCheck(EncodeAnswer(u) == once, "a successful answer's second encoding is the first");
    chi::DeleteTask(u);
  }
  if constexpr (std::is_same_v<T, admin::MonitorTask>) CheckReport(*t);
  chi::DeleteTask(t);
}

using Checker = void (*)(const char *, size_t);
/** One entry per task type of the admin and demo modules (demo's CreateTask is admin's). */
constexpr Checker kCheckers[] = {
    &CheckAnswerAs<admin::CreatePoolTask>,    &CheckAnswerAs<admin::DestroyPoolTask>,
    &CheckAnswerAs<admin::StopRuntimeTask>,   &CheckAnswerAs<admin::RegisterMemoryTask>,
    &CheckAnswerAs<admin::GpuAttachPoolTask>, &CheckAnswerAs<admin::MonitorTask>,
    &CheckAnswerAs<demo::CustomTask>,         &CheckAnswerAs<demo::GpuSubmitTask>,
    &CheckAnswerAs<demo::WaitTestTask>,       &CheckAnswerAs<demo::LargeOutputTask>,
    &CheckAnswerAs<demo::LockHoldTask>,       &CheckAnswerAs<demo::CountTask>,
    &CheckAnswerAs<demo::ReadRegisteredTask>,
};
constexpr size_t kNumTypes = sizeof(kCheckers) / sizeof(kCheckers[0]);

}  // namespace

/** Byte 0 picks the task type; the rest is the answer envelope ([u64 id][header][outputs]). */
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FuzzBytes in(data, size);
  const Checker check = kCheckers[in.TakeByte() % kNumTypes];
  check(in.RestData(), in.RestSize());
  return 0;
}
