// Symbol export macro: the shared library hides everything not marked DMUON_API.
#pragma once

#if defined(DMUON_STATIC_DEFINE)
#define DMUON_API
#elif defined(DMUON_BUILDING_LIBRARY)
#define DMUON_API __attribute__((visibility("default")))
#else
#define DMUON_API __attribute__((visibility("default")))
#endif
