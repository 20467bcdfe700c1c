#pragma once
/// \file Build-wide switches: version, host/device annotation, branch hints.

#define MOEKIT_VERSION_MAJOR 0
#define MOEKIT_VERSION_MINOR 1
#define MOEKIT_VERSION_PATCH 0

// The same function bodies compile for the CPU and, under nvcc, for the GPU: kernels keep their
// per-thread work in MOEKIT_HOST_DEVICE functions so tests can run them on the host.
#if defined(__CUDACC__)
#define MOEKIT_HOST_DEVICE __host__ __device__
#define MOEKIT_DEVICE __device__
#else
#define MOEKIT_HOST_DEVICE
#define MOEKIT_DEVICE
#endif

#if defined(__GNUC__) || defined(__clang__)
#define MOEKIT_LIKELY(x) __builtin_expect(!!(x), 1)
#define MOEKIT_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define MOEKIT_LIKELY(x) (x)
#define MOEKIT_UNLIKELY(x) (x)
#endif
