# The Debian package of the torch-free part: trainsupd, trainctl, the
# systemd unit, the default configuration (a conffile), the Python client
# for Debian's python3, bash completion for trainctl, manual pages and the
# documentation (docs/operations.md, "The package"). Made by CPack's DEB
# generator from this build tree: the package holds the binaries the test
# suite ran (docs/decisions.md says why CPack and not debhelper).
#
#   cmake --build build --target trainsup_package_files   (ALL builds it too)
#   cpack --config build/CPackConfig.cmake -B build/package
#     -> build/package/trainsup_VERSION_ARCH.deb
#
# The worker is not packaged: it is built against each box's own torch
# (deploy/build-worker.sh). Only the install component "daemon" is packed.
include(GNUInstallDirs)

set(pkg_dir ${CMAKE_BINARY_DIR}/package-files)
file(MAKE_DIRECTORY ${pkg_dir})

# Manual pages from the programs' own --help and --version (help2man), and
# the completion script from trainctl's own options: neither can drift.
find_program(TRAINSUP_HELP2MAN help2man)
find_program(TRAINSUP_GZIP gzip REQUIRED)
set(pkg_outputs "")
if(TRAINSUP_HELP2MAN)
  foreach(entry "trainsupd|8|supervise sparse-convolution training workers"
                "trainctl|1|submit, watch and inspect training runs of trainsupd")
    string(REPLACE "|" ";" entry "${entry}")
    list(GET entry 0 prog)
    list(GET entry 1 section)
    list(GET entry 2 summary)
    add_custom_command(
      OUTPUT ${pkg_dir}/${prog}.${section}.gz
      COMMAND ${TRAINSUP_HELP2MAN} --no-info --no-discard-stderr --section=${section}
              "--name=${summary}" --output=${pkg_dir}/${prog}.${section} $<TARGET_FILE:${prog}>
      COMMAND ${TRAINSUP_GZIP} -9nf ${pkg_dir}/${prog}.${section}
      DEPENDS ${prog}
      COMMENT "manual page ${prog}(${section})"
      VERBATIM)
    list(APPEND pkg_outputs ${pkg_dir}/${prog}.${section}.gz)
    install(FILES ${pkg_dir}/${prog}.${section}.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section}
            COMPONENT daemon)
  endforeach()
else()
  message(STATUS "trainsup: help2man not found: the package has no manual pages")
endif()
add_custom_command(
  OUTPUT ${pkg_dir}/trainctl.bash
  COMMAND sh -c "\"$1\" completion bash > \"$2\"" sh $<TARGET_FILE:trainctl>
          ${pkg_dir}/trainctl.bash
  DEPENDS trainctl
  COMMENT "bash completion for trainctl"
  VERBATIM)
add_custom_command(
  OUTPUT ${pkg_dir}/changelog.gz
  COMMAND sh -c "\"$1\" -9nc \"$2\" > \"$3\"" sh ${TRAINSUP_GZIP}
          ${PROJECT_SOURCE_DIR}/deploy/debian/changelog ${pkg_dir}/changelog.gz
  DEPENDS ${PROJECT_SOURCE_DIR}/deploy/debian/changelog
  COMMENT "package changelog"
  VERBATIM)
list(APPEND pkg_outputs ${pkg_dir}/trainctl.bash ${pkg_dir}/changelog.gz)
add_custom_target(trainsup_package_files ALL DEPENDS ${pkg_outputs})

# -- what the package holds ---------------------------------------------------------
install(TARGETS trainsupd trainctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT daemon)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/trainsupd.service DESTINATION /lib/systemd/system
        COMPONENT daemon)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/trainsupd.toml DESTINATION /etc/trainsup
        COMPONENT daemon)
install(FILES ${pkg_dir}/trainctl.bash DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
        RENAME trainctl COMPONENT daemon)
set(doc_dir ${CMAKE_INSTALL_DATADIR}/doc/trainsup)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/debian/copyright ${pkg_dir}/changelog.gz
        DESTINATION ${doc_dir} COMPONENT daemon)
foreach(doc operations configuration trainctl quickstart run-spec python-client api supervisor
            distributed guard checkpoints)
  install(FILES ${PROJECT_SOURCE_DIR}/docs/${doc}.md DESTINATION ${doc_dir} COMPONENT daemon)
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/deploy/grafana/trainsup-dashboard.json
        DESTINATION ${doc_dir}/examples COMPONENT daemon)
# The Python client: its wheel (python/CMakeLists.txt) unpacked where
# Debian's python3 finds packages, with its dist-info, so pip sees it.
if(TRAINSUP_PYTHON_WHEEL)
  install(CODE "file(ARCHIVE_EXTRACT INPUT \"${TRAINSUP_PYTHON_WHEEL}\"
                     DESTINATION \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/lib/python3/dist-packages\")"
          COMPONENT daemon)
else()
  message(STATUS "trainsup: no Python client wheel: the package will not carry the client")
endif()

# -- CPack ---------------------------------------------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_COMPONENTS_ALL daemon)
set(CPACK_DEB_COMPONENT_INSTALL OFF)
set(CPACK_PACKAGE_NAME trainsup)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_CONTACT "trainsup maintainers <maintainers@trainsup.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "supervisor for unattended sparse-convolution training")
# The long description, as CPack writes it under the synopsis above: one
# space before each line, " ." for the empty one.
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
  "trainsupd launches one training worker per GPU (or CPU slot), watches exit
codes and heartbeats, and relaunches dead, frozen or hung workers from the
newest verified checkpoint; runs, attempts and events are kept in SQLite.
Multi-node jobs coordinate through etcd.

This package holds the daemon, the trainctl command line tool, the systemd
unit (neither enabled nor started), the default configuration, the Python
client for training scripts and the documentation. The training worker is
built against the machine's own PyTorch (see operations.md).")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Shared libraries from the binaries (dpkg-shlibdeps); what the scripts and
# the Python client need is listed here (procps: the unit's /bin/kill).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
  "adduser, init-system-helpers (>= 1.52), procps, python3:any (>= 3.9), python3-grpcio (>= 1.51), python3-protobuf (>= 3.21), python3-xxhash (>= 2.0)")
# gdb: the stacks of hung workers in their logs (workers.capture_stacks).
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "gdb")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "etcd-server")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${PROJECT_SOURCE_DIR}/deploy/debian/conffiles ${PROJECT_SOURCE_DIR}/deploy/debian/postinst
  ${PROJECT_SOURCE_DIR}/deploy/debian/prerm ${PROJECT_SOURCE_DIR}/deploy/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/package)
include(CPack)
