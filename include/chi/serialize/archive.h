// chi's serialization, in one include: OutputArchive/InputArchive (one binary
// format for ring buffers, ZeroMQ and GPU memory) and BatchWriter/BatchReader
// (many records per buffer). Types opt in with
// `template <typename Ar> CHI_CROSS_FUN void serialize(Ar &ar) { ar(a_, b_); }`.
#pragma once

#include "chi/serialize/archive_common.h"  // wire traits, kLengthPrefixBytes
#include "chi/serialize/batch.h"           // BatchWriter, BatchReader
#include "chi/serialize/input_archive.h"   // InputArchive
#include "chi/serialize/output_archive.h"  // OutputArchive
