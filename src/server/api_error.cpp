#include "server/api_error.h"

namespace kvq::server {

const char* error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 429: return "rate_limit_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

ApiError::ApiError(int status, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)), status_(status), type_(error_type(status)), param_(std::move(param)),
      code_(std::move(code)) {}

nlohmann::json ApiError::body() const {
  auto or_null = [](const std::string& s) { return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s); };
  return {{"error", {{"message", what()}, {"type", type_}, {"param", or_null(param_)}, {"code", or_null(code_)}}}};
}

}  // namespace kvq::server
