# trainsup_use_torch(target): links LibTorch (with OpenMP: ATen's
# parallel_for is a header template that needs -fopenmp in our own
# translation units; OpenMP::OpenMP_CXX is LibTorch's own libgomp where it
# ships one, cmake/TrainsupLibTorch.cmake) and reuses the shared precompiled header, so each
# torch-heavy translation unit does not parse the LibTorch headers again.
function(trainsup_use_torch target)
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES} OpenMP::OpenMP_CXX)
  if(TARGET trainsup_torch_pch)
    target_precompile_headers(${target} REUSE_FROM trainsup_torch_pch)
  endif()
endfunction()
