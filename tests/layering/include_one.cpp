// One #include, compiled against one layer's include roots by the layering tests
// (tests/CMakeLists.txt): a header the layer must not see fails to compile, so a wrong include
// in src/ is a build error rather than a habit.
#include SPECRPC_LAYER_HEADER
