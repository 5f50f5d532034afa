// Registration: the custom-op domains (one per inner-session set-up, plus the nested variant
// every body gets), the session config entries read at registration, and the library's two
// exported entry points (exports.map).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "attributes.h"
#include "inner_session.h"
#include "mlu_fusion_block.h"
#include "ort_support.h"

namespace onnxmlu {

namespace {

// "MLUFusionBlock '<name>': cannot create the kernel: <detail>", for CreateKernelV2's catch-all;
// out of memory it names no node rather than allocate.
OrtStatus* CreationError(const OrtKernelInfo* info, const char* detail) noexcept {
  try {
    const std::string prefix = Prefix(ReadNodeName(info)) + "cannot create the kernel: ";
    return ErrorStatus(ORT_FAIL, prefix.c_str(), detail);
  } catch (...) {
    return ErrorStatus(ORT_FAIL, "MLUFusionBlock: cannot create the kernel: ", detail);
  }
}

}  // namespace

OrtStatusPtr FusionBlockOp::CreateKernelV2(const OrtApi& /*api*/, const OrtKernelInfo* info, void** kernel) const noexcept {
  *kernel = nullptr;
  try {
    if (nested_) {
      throw BlockError(ORT_INVALID_GRAPH, Prefix(ReadNodeName(info)) + "this node is inside another block's body; " + kNestedMessage);
    }
    *kernel = new FusionBlockKernel(info, config_);
    return nullptr;
  } catch (const BlockError& error) {
    return ErrorStatus(error.code(), "", error.what());
  } catch (const std::exception& error) {  // std::bad_alloc among them
    return CreationError(info, error.what());
  } catch (...) {
    return CreationError(info, "unknown error");
  }
}

namespace {

// Ops and domains must outlive every session that uses them: they live for the whole process
// (onnxruntime never takes ownership of a custom-op domain), created once per distinct
// InnerConfig (a handful per process), shared by all session options registered with it.
FusionBlockOp g_nested_op(/*nested=*/true, InnerConfig{});

OrtCustomOpDomain* MakeDomain(FusionBlockOp* op) {
  OrtCustomOpDomain* domain = nullptr;
  Check(Api().CreateCustomOpDomain(kDomain, &domain), "onnxmlu: ");
  OrtStatus* status = Api().CustomOpDomain_Add(domain, op);
  if (status != nullptr) {
    Api().ReleaseCustomOpDomain(domain);
    Check(status, "onnxmlu: ");
  }
  return domain;
}

OrtCustomOpDomain* BlockDomain(const InnerConfig& config) {
  struct Registered {
    std::unique_ptr<FusionBlockOp> op;  // heap: onnxruntime keeps pointers to it
    OrtCustomOpDomain* domain;
  };
  static std::mutex mutex;
  static std::map<InnerConfig, Registered> registry;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = registry.find(config);
  if (found != registry.end()) return found->second.domain;
  auto op = std::make_unique<FusionBlockOp>(/*nested=*/false, config);
  OrtCustomOpDomain* domain = MakeDomain(op.get());
  registry.emplace(config, Registered{std::move(op), domain});
  return domain;
}

// Reads an optional session config entry; false when it is absent.
bool ReadConfigEntry(const OrtApi& api, const OrtSessionOptions* options, const char* key, std::string* value) {
  int present = 0;
  Check(api.HasSessionConfigEntry(options, key, &present), "onnxmlu: ");
  if (!present) return false;
  size_t size = 0;
  Check(api.GetSessionConfigEntry(options, key, nullptr, &size), "onnxmlu: ");
  value->assign(size, '\0');
  Check(api.GetSessionConfigEntry(options, key, value->data(), &size), "onnxmlu: ");
  value->resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
  return true;
}

// The inner-session set-up asked for by the options' config entries (see the header).
InnerConfig ReadInnerConfig(const OrtApi& api, const OrtSessionOptions* options) {
  InnerConfig config;
  std::string text;
  if (ReadConfigEntry(api, options, kInnerThreadsKey, &text)) {
    char* end = nullptr;
    errno = 0;
    long value = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || errno != 0 || *end != '\0' || value < 0 || value > 4096) {
      throw BlockError(ORT_INVALID_ARGUMENT, std::string("onnxmlu: session config entry ") + kInnerThreadsKey +
                                                 " must be an integer from 0 to 4096, got '" + text + "'");
    }
    config.threads = static_cast<int>(value);
  }
  if (ReadConfigEntry(api, options, kInnerSpinningKey, &text)) {
    if (text != "0" && text != "1") {
      throw BlockError(ORT_INVALID_ARGUMENT, std::string("onnxmlu: session config entry ") + kInnerSpinningKey +
                                                 " must be '0' or '1', got '" + text + "'");
    }
    config.spinning = text == "1";
  }
  if (ReadConfigEntry(api, options, kInnerGlobalPoolKey, &text)) {
    if (text != "0" && text != "1") {
      throw BlockError(ORT_INVALID_ARGUMENT, std::string("onnxmlu: session config entry ") + kInnerGlobalPoolKey +
                                                 " must be '0' or '1', got '" + text + "'");
    }
    config.global_pool = text == "1" ? GlobalPool::kRequire : GlobalPool::kNever;
  }
  return config;
}

}  // namespace

OrtCustomOpDomain* NestedDomain() {
  static OrtCustomOpDomain* domain = MakeDomain(&g_nested_op);
  return domain;
}
}  // namespace onnxmlu

extern "C" OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  if (api_base == nullptr) return nullptr;  // nothing to report an error through
  const OrtApi* api = api_base->GetApi(onnxmlu::kOrtApiVersion);
  if (api == nullptr) {
    const OrtApi* oldest = api_base->GetApi(1);
    if (oldest == nullptr) return nullptr;
    char message[256];  // no allocation: nothing may throw out of this C entry point
    std::snprintf(message, sizeof(message), "libonnxmlu_ops needs onnxruntime >= 1.21 (C API version %u), this is onnxruntime %s",
                  static_cast<unsigned>(onnxmlu::kOrtApiVersion), api_base->GetVersionString());
    return oldest->CreateStatus(ORT_FAIL, message);
  }
  Ort::InitApi(api);
  // Registering twice into one SessionOptions would fail session creation ("Domain already set
  // in registry"); the marker entry makes registration idempotent and tells Python it happened.
  int registered = 0;
  if (OrtStatus* status = api->HasSessionConfigEntry(options, onnxmlu::kRegisteredKey, &registered)) {
    return status;
  }
  if (registered) return nullptr;
  try {
    const onnxmlu::InnerConfig config = onnxmlu::ReadInnerConfig(*api, options);
    if (OrtStatus* status = api->AddCustomOpDomain(options, onnxmlu::BlockDomain(config))) return status;
    return api->AddSessionConfigEntry(options, onnxmlu::kRegisteredKey, "1");
  } catch (const onnxmlu::BlockError& error) {
    return onnxmlu::ErrorStatus(error.code(), "", error.what());
  } catch (const std::exception& error) {
    return api->CreateStatus(ORT_FAIL, error.what());
  } catch (...) {
    return api->CreateStatus(ORT_FAIL, "onnxmlu: cannot register the custom-op domain");
  }
}

extern "C" int64_t OnnxmluThreadReport(int64_t* values, int64_t count) {
  const auto& report = onnxmlu::g_thread_report;
  for (int64_t i = 0; values != nullptr && i < count && i < static_cast<int64_t>(report.size()); ++i) {
    values[i] = report[i].load(std::memory_order_relaxed);
  }
  return static_cast<int64_t>(report.size());
}
