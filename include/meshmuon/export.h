// Symbol export macro: the shared library hides everything not marked MESHMUON_API.
#pragma once

#if defined(MESHMUON_STATIC_DEFINE)
#define MESHMUON_API
#elif defined(MESHMUON_BUILDING_LIBRARY)
#define MESHMUON_API __attribute__((visibility("default")))
#else
#define MESHMUON_API __attribute__((visibility("default")))
#endif
