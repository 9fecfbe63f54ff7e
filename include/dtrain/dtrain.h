// dtrain: distributed training. One include for the whole public API.
#pragma once

#include "dtrain/error.h"
#include "dtrain/identity.h"
#include "dtrain/parallel_layout.h"
#include "dtrain/preemption.h"
#include "dtrain/process_group.h"
#include "dtrain/progress.h"
#include "dtrain/store.h"
#include "dtrain/tensor.h"
#include "dtrain/work.h"
