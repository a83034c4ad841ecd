// A program that uses a standalone runtime on this node as a pure client: no runtime in
// this process, the same client calls. Start a runtime first, for instance with
//   chimaera runtime start --with-demo   (the demo module is a test module, served on request)
// then run this; CHI_IPC_MODE picks the transport (shm, the default; ipc or tcp) and CHI_PORT
// the runtime.
//
//   ./client_process [echoes=100]
#include <chi/chi.h>
#include <chi/mods/demo/demo_client.h>  // the client half only: the module runs in the runtime

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char **argv) {
  const int echoes = argc > 1 ? std::atoi(argv[1]) : 100;
  if (!chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, false)) {  // connect, do not embed
    std::fprintf(stderr, "no runtime: %s\n", chi::Chimaera::Get().LastError().ToString().c_str());
    return 1;
  }
  chimaera::demo::Client client;
  auto created = client.AsyncCreate(chi::PoolQuery::Dynamic(), "client_pool", chi::PoolId(220, 0));
  if (!created.Wait(10) || created->GetReturnCode() != 0) {
    std::fprintf(stderr, "create failed: %s\n",
                 created.IsComplete() ? created->GetMessage() : "no answer in 10 s");
    return 1;
  }
  int wrong = 0;
  for (int i = 0; i < echoes; ++i) {
    const std::string data = "echo " + std::to_string(i);
    auto f = client.AsyncCustom(chi::PoolQuery::Local(), data);
    // A runtime that stopped or died answers too: a non-zero code that says why.
    wrong += f.Wait(10) && f->GetReturnCode() == 0 && f->data_.view() == data ? 0 : 1;
  }
  std::printf("client_process: %d echoes over %s, %d wrong\n", echoes,
              chi::Chimaera::Get().GetTransport()->Name(), wrong);
  chi::CHIMAERA_FINALIZE();
  return wrong == 0 ? 0 : 1;
}
