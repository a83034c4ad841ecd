# chi::chimaera asks for C++20 (cxx_std_20), which CMake also requires of CUDA sources.
# CMake releases before nvcc 13 do not know its C++20 flag; tell them (harmless otherwise).
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
