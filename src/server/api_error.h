// The server's error channel: an OpenAI-style error with its HTTP status, rendered as
//   {"error": {"message": ..., "type": ..., "param": ... | null, "code": ... | null}}
// Types by status (docs/guide/serve.md): 400 / 404 / 413 invalid_request_error, 401 authentication_error, 429
// rate_limit_error, 500 / 503 server_error.
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace kvq::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {});

  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  nlohmann::json body() const;

 private:
  int status_;
  std::string type_, param_, code_;
};

// The error type of an HTTP status.
const char* error_type(int status);

}  // namespace kvq::server
