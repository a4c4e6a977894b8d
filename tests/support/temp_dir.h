// Test support: a fresh directory per GoogleTest test (named after the process, suite and test so
// parallel runs never collide), removed at the end.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace meshmuon::test {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "meshmuon_test_") {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = (std::filesystem::temp_directory_path() /
             (prefix + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name()))
                .string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

}  // namespace meshmuon::test
