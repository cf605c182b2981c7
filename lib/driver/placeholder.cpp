// SPDX-License-Identifier: Apache-2.0
// Placeholder: replaced as the layer is written.
namespace kjit {}
