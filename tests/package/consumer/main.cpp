// A project that only knows find_package(kjit): parses a spec and plans offline.
#include <kjit/kjit.hpp>

#include <cstdio>

int main() {
  const kjit::KernelSpec spec = kjit::KernelSpec::parse("probe:heavy=0@sm_90");
  const kjit::DeviceLimits h200 = kjit::DeviceLimits::for_arch(kjit::Arch::parse("sm_90"));
  const auto checks =
      kjit::check_launch(kjit::LaunchShape{{65535, 65535, 1}, {1024, 1, 1}, 0}, h200);
  std::printf("kjit %s: %s, %zu limits checked\n", kjit::kVersion, spec.str().c_str(),
              checks.size());
  return spec.str() == "probe:heavy=0@sm_90" ? 0 : 1;
}
