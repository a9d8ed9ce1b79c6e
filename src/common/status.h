// Forwarder: Status/Result are part of the public API.
#pragma once
#include "specrpc/status.h"
