// Must not compile with -Werror=unused-result: a handler that ignores SleepFor's result
// would report success for a sleep a stopping runtime cut short (tests/packaging.cmake).
#include <chi/runtime/worker.h>

void Handler() { chi::SleepFor(1000); }
