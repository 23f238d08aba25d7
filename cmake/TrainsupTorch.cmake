# trainsup_use_torch(target): links LibTorch and gives the target the shared
# precompiled header, so each torch-heavy translation unit does not parse
# the LibTorch headers again.
function(trainsup_use_torch target)
  target_link_libraries(${target} PUBLIC ${TORCH_LIBRARIES})
  if(TARGET trainsup_torch_pch)
    target_precompile_headers(${target} REUSE_FROM trainsup_torch_pch)
  endif()
endfunction()
